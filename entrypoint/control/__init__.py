"""The control channel between the nodes' entrypoints: JSON lines over TCP to node 0. The wire, and
no decision taken over it.

Owns the messages (`messages`, checked field by field in `message_fields`; the ranks' records they
carry in `rank_records`; the shared framing and errors in `control`), node 0's end
(`control_server`, its defences in `control_guard`), which carries out the actions of node 0's
mind (`actions`: `Send`, `Log`, `Close` and the `Mind` protocol; the mind itself is
entrypoint.coordinator), every node's end (`control_channel`, over `sockets`; silence counted
while awake, `awake`), and the job's identity and token (`identity`).

Imports `plan` only (and no `coordinator`, `metrics`, `supervise`, `local`, `doctor`, `render`,
`job` or `cli`). Importing this package imports nothing.
"""
