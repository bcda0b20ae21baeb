#!/usr/bin/env python3
"""`make demo`: the image's built-in job as a 2-node cluster on this machine.

Two containers of the image on a private Docker network, started as two hand-started nodes
are (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT), 2 CPU workers each. Both nodes' logs are
printed as they come, prefixed by node; it ends with the final loss, from every worker's own
report. Exit 0 when every node exited 0 and every worker reported; 1 otherwise (with the logs);
130 on Ctrl-C. Containers and the network are removed in every case.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from entrypoint.cluster import Cluster, Node  # noqa: E402 - the helper the cluster tests use


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default=os.environ.get("IMAGE", "multinode:dev"))
    parser.add_argument("--nodes", type=int, default=2, help="node containers (default 2)")
    parser.add_argument("--workers", type=int, default=2, help="CPU workers per node (default 2; "
                        "the JAX job always runs one process per node)")
    parser.add_argument("--job", choices=("deepspeed", "jax"), default="deepspeed")
    parser.add_argument("--steps", type=int, help="optimizer steps (default: the job's own, 100)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before the nodes are killed (default 600)")
    args = parser.parse_args(argv)

    settings = {"ENTRYPOINT_JOB": args.job, "ENTRYPOINT_LOG_ALL_NODES": "true"}
    if args.job == "deepspeed":
        settings["ENTRYPOINT_NPROC_PER_NODE"] = str(args.workers)
    if args.steps:
        settings["ENTRYPOINT_JOB_STEPS"] = str(args.steps)

    try:
        with Cluster(args.image, prefix=f"demo-{os.urandom(2).hex()}", echo=print) as cluster:
            master = cluster.hostname("node", 0)
            nodes = [Node(cluster.hostname("node", rank),
                          {"NNODES": str(args.nodes), "NODE_RANK": str(rank), "MASTER_ADDR": master,
                           "MASTER_PORT": "29500"} | settings)
                     for rank in range(args.nodes)]
            print(f"demo: {args.nodes} nodes on network {cluster.network_name} "
                  f"({', '.join(n.name for n in nodes)}), image {args.image}", flush=True)
            run = cluster.run(nodes, timeout=args.timeout)
    except KeyboardInterrupt:
        print("demo: interrupted; containers and network removed", file=sys.stderr)
        return 130
    problem = run.problem()  # the log was printed as it came
    if problem:
        print(f"demo: FAILED: {problem}", file=sys.stderr)
        return 1
    results = run.results
    expected = results[0]["world_size"] if results else 0
    if not results or len(results) != expected:
        print(f"demo: FAILED: {len(results)} worker reports, expected {expected}", file=sys.stderr)
        return 1
    print("\ndemo: every worker's report (<output>/results/rank<R>.json):")
    for r in results:
        writer = "  wrote the checkpoint" if r["checkpoint_writer"] else ""
        print(f"  rank {r['rank']} of {r['world_size']} on {r['node']} (node {r['node_rank']}, "
              f"local rank {r['local_rank']}){writer}")
    first = results[0]
    print(f"demo: {first['job']} on {args.nodes} nodes x "
          f"{len(results) // args.nodes} workers, {first['steps']} steps in {run.seconds:.0f} s; "
          f"final loss {first['final_loss']:.4f} (first {first['first_loss']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
