"""The environment and the node's facts in, one frozen `Plan` out (`node_plan.make_plan`, its
steps in `plan_steps`), and the primitives it stands on: the errors
(`errors`), the bounded readers of values, hostlists and files (`values`, `hostlist`, `files`),
the ENTRYPOINT_* settings (`settings`), secret masking (`secrets`), the derived ports (`ports`),
the probes' plain results (`facts`), the platform readers (`platforms/`), and the pure
decisions: GPU layout (`gpus`), launchers (`launchers`), DeepSpeed configs (`configs/`, with
their JSON files), the NCCL/gloo interface (`network`).

Pure and the lowest layer but one: imports only `trainer_side` (the site hook's path). Importing
this package imports nothing; pydantic loads with `settings`.
"""
