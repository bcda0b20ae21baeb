"""`entrypoint local`: a multi-node job as node containers on this one machine (`local_job`), and
the cluster of containers it shares with `make demo` and the cluster tests (`cluster`: a run's
nodes, the containers, what comes back; the Docker SDK's use in `cluster_docker`).

Imports `plan`, `supervise` (the GPU probe) and `render` (its option checks); never `doctor`,
`job` or `cli`. Importing this package imports nothing; the Docker SDK loads only when a cluster
is made, never inside the image.
"""
