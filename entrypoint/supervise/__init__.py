"""A node's life, at the edge: probe the node (`probe`), run the plan (`node`: settings,
platform, probes, plan; `report`: the plan, readable; `launch`: check it against the node and
write its files; `dsops`: the DeepSpeed ops the image lacks), join the other nodes (`join`),
start and supervise the launcher (`supervise`; one start in `launcher_process`, one launch as the
loop sees it in `launch_watch`, signals in `worker_signals`, the process tree in `procs`, what
failed in `failures`, heartbeat figures in `gpu_stats`), and log without blocking (`logs`).

Imports `plan` and `control` (never `local`, `doctor`, `render`, `job` or `cli`). Importing this
package imports nothing.
"""
