"""A node's life, at the edge: probe the node (`probe`), run the plan (`node`: settings,
platform, probes, plan; `report`: the plan, readable; `preflight`: check it against the node and
write its files; `dsops`: the DeepSpeed ops the image lacks), join the other nodes (`join`, the
state it shares with the loop in `node_state`), start and supervise the launcher (`supervisor`;
one start in `launcher_process`, how a node ends and one launch as the loop sees it in
`node_exits`, signals in `worker_signals`, the process tree in `procs`, what failed in
`failures`, its ranks' reports in `rank_inbox`, heartbeat figures in `gpu_stats`, GPU and link
health in `health`), and log without blocking (`logs`).

Imports `plan`, `control`, `coordinator` and `metrics` (never `local`, `doctor`, `render`, `job`
or `cli`). Importing this package imports nothing.
"""
