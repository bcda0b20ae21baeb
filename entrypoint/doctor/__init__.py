"""The commands that look at a node or a job and say what is wrong: `entrypoint doctor` (the
edge and the command in `examine`, the pure checks in `doctor_checks`, the report and its table in
`doctor_report`) and `entrypoint status` (every node of a running job, from node 0's /metrics, in
`status`).

Imports `plan`, `control` and `supervise` (doctor shows what `run` would do, through the same
code); never `local`, `render`, `job` or `cli`. Importing this package imports nothing: the CLI
imports `status` at every start, and it loads prometheus-client only when it runs.
"""
