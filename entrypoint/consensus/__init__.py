"""The job's small state and node 0's seat on etcd (Raft): a client of its JSON gateway, a lease
kept alive with the fence that stops a node's trainers before its lease could end, and node 0's
election by one transaction. Edge code (sockets, a thread) and no decision of the job's: it
imports the standard library alone."""
