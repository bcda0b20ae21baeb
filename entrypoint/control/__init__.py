"""The control channel between the nodes' entrypoints: JSON lines over TCP to node 0.

Owns the wire (`messages`, checked field by field in `message_fields`; the shared framing and
errors in `control`), node 0's end (`control_server`, its defences in `control_guard`), every
node's end (`control_channel`, over `sockets`), the job's identity and token (`identity`), what
must match on every node (`fingerprint`), node 0's pure state machine (`conductor`, standing on
`seating`, with its vocabulary in `conductor_terms`; who trains in which rank in `roster`), slow
nodes (`slow_nodes`) and node 0's `/metrics` (`metrics`).

Imports `plan` only (and no `supervise`, `local`, `doctor`, `render`, `job` or `cli`). Importing
this package imports nothing.
"""
