"""Node 0's `/metrics`: every node's and rank's health in Prometheus' text format, read from node
0's mind at scrape time (`collector`), served by a small server bounded against strangers
(`metrics_server`). Imports `coordinator`, `control` and `plan`. Importing this package imports
nothing (prometheus-client loads with `collector`, on node 0 only)."""
