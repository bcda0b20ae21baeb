"""Node 0's mind: the job's state as one record and the pure rules over it. Events in, actions out.

`state` holds `JobState`, everything node 0 knows of the job. `conductor` is the state machine, a
method per event (a hello, a beat, an exit, a signal, the ranks' stacks, a GPU's health, a closed
connection, the clock's tick); its rules are plain functions of the state: each start's join and
seats (`seating`, who sits where in `roster`, the nodes compared in `comparison`), the verdicts
(`verdicts`: a failure, a restart, the end), hangs (`hangs`), the ranks' steps judged
(`rank_judgement`) and slow nodes (`slow_nodes`).

The state is whole: written elsewhere and read back (`Conductor.resume`), it decides every later
event as the original does (tests/unit/test_job_state.py), which node 0's replacement needs.

No sockets, clocks, threads or files (import-linter's "node 0's mind is pure"): the caller passes
`now` and carries out the returned actions (entrypoint.control.control_server). Imports `control`'s
records and `plan` only. Importing this package imports nothing.
"""
