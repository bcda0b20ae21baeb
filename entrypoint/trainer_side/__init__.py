"""What runs inside the trainer's own interpreter, not the entrypoint's: the site hook
(`site-hook/`, the directory the plan puts first on the trainer's PYTHONPATH), JAX's cluster
detection reading the plan (`jax_cluster`), accelerate on CPU nodes (`accelerate_cpu`), gloo's
threads settled before exit (`exit_guard`), and the import hook they share (`after_import`).

The bottom layer: imports no other subpackage (the trainer's interpreter loads only these few
modules), and nothing here imports a library before the trainer does. `plan` imports it for
`jax_cluster.SITE_HOOK`, the hook's path.
"""
