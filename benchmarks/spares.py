"""What a lost node costs, measured as a user feels it, in one run on this machine's Docker:
node containers of the image training the built-in DeepSpeed job (2 CPU workers each, 2 nodes
training, checkpoints every 10 steps on a shared volume), a node killed once the job trains.

- spare:    2 nodes + 1 spare, node 1 killed: seconds from the kill to node 0's first training
            step after the resume;
- shrink:   3 nodes, ENTRYPOINT_MIN_NODES=2, node 1 killed: likewise, on 2 nodes;
- platform: 2 nodes, no spare: node 1 killed, every node exits 75, the platform starts every
            container again (what a Job's retry does): seconds from the kill to the first step
            after the resume of the new containers (the image is local: no pull counted);
- goodput:  --minutes of training (from node 0's first step; longer if the last kill's
            takeover outlasts it) with a node killed every --every seconds, spares enough for
            each: the steps trained over the steps an undisturbed run trains in the same
            time (its rate measured before the first kill).

Prints figures; asserts nothing.

    python benchmarks/spares.py [--image multinode:dev] [--minutes 10] [--every 120]
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from entrypoint.local.cluster import Node  # noqa: E402
from faulty_cluster import Fault, FaultyCluster  # noqa: E402

SHARED, OUTPUT = "/shared", "/shared/job"
STEP = re.compile(r"\[job\] step (\d+)/")
RESUMED = "[job] resuming from checkpoint"
FIRST_STEP = "[job] step 1/"


def specs(c: FaultyCluster, n: int, steps: int, **env: str) -> list[Node]:
    master = c.hostname("node", 0)
    base = {
        "NNODES": str(n),
        "MASTER_ADDR": master,
        "MASTER_PORT": "29500",
        "ENTRYPOINT_NPROC_PER_NODE": "2",
        "ENTRYPOINT_JOB_STEPS": str(steps),
        "ENTRYPOINT_JOB_LOG_EVERY": "1",
        "ENTRYPOINT_JOB_SAVE_EVERY": "10",
        "ENTRYPOINT_JOB_OUTPUT": OUTPUT,
    }
    return [Node(c.hostname("node", r), base | {"NODE_RANK": str(r)} | env) for r in range(n)]


def steps_of(run, node: str) -> list[tuple[float, int]]:
    """(seconds after the start, step) of every step line node 0 printed."""
    out = []
    for line, t in zip(run.node(node).lines, run.node(node).times, strict=False):
        m = STEP.search(line)
        if m:
            out.append((t, int(m.group(1))))
    return out


def first_step_after(run, node: str, since: float) -> float:
    """When the node printed its first step after a resume that came after `since`."""
    resumed = [
        t for line, t in zip(run.node(node).lines, run.node(node).times, strict=False)
        if RESUMED in line and t > since
    ]  # fmt: skip
    if not resumed:
        raise SystemExit(f"no resume after {since:.1f} s:\n{run.log(60)}")
    return next(t for t, _ in steps_of(run, node) if t > resumed[0])


def trained_since_resume(node, since: float) -> bool:
    """Whether `node` (a NodeRun) printed a step after a resume that came after `since`."""
    seen = list(zip(node.lines, node.times, strict=False))
    resumed = next((t for line, t in seen if RESUMED in line and t > since), None)
    return resumed is not None and any(STEP.search(line) and t > resumed for line, t in seen)


def kill_when_training(c: FaultyCluster, victim: str) -> Fault:
    return Fault("kill", lambda c: c.kill(victim), node=c.hostname("node", 0), line="step 25/")


def first_line_after(run, node: str, text: str, since: float) -> float:
    return next(
        (t for line, t in zip(run.node(node).lines, run.node(node).times, strict=False)
         if text in line and t > since),
        float("nan"),
    )  # fmt: skip


def elastic(image: str, client, n: int, **env: str) -> tuple[float, float, float, float]:
    """Seconds from the kill to: node 0 naming the loss, the last node's old launch ended (its
    workers' exit), the restart's go (every node joined again), node 0's next step."""
    with FaultyCluster(image, client=client, shared=SHARED, output=OUTPUT) as c:
        run = c.run(
            specs(c, n, 80, **env),
            timeout=600,
            grace=float("inf"),
            faults=[kill_when_training(c, c.hostname("node", 1))],
        )
        node0, kill = c.hostname("node", 0), run.faults["kill"]
        named = first_line_after(run, node0, "lost node", kill) - kill
        ended = (
            max(
                first_line_after(run, node.name, "after the restart was called", kill)
                for node in run.nodes
                if any("after the restart was called" in line for line in node.lines)
            )
            - kill
        )  # the last node whose old workers ended
        go = first_line_after(run, node0, "restart 1:", kill) - kill
        return named, ended, go, first_step_after(run, node0, kill) - kill


def platform_restart(image: str, client) -> float:
    with FaultyCluster(image, client=client, shared=SHARED, output=OUTPUT) as c:
        nodes = specs(c, 2, 80)
        first = c.run(nodes, timeout=600, grace=90, faults=[kill_when_training(c, nodes[1].name)])
        down = first.seconds - first.faults["kill"]  # until the last container exited
        second = c.run(nodes, timeout=600)  # every container again, as a Job's retry
        return down + first_step_after(second, nodes[0].name, 0.0)


def goodput(image: str, client, minutes: float, every: float) -> tuple[float, int, float, list]:
    """(goodput, kills, the undisturbed rate, each kill's seconds to the next step). The rate
    is the best of the stretches between kills: the conservative reference."""
    kills = max(1, int(minutes * 60 // every) - 1)  # the last kill comes before the end
    with FaultyCluster(image, client=client, shared=SHARED, output=OUTPUT) as c:
        node0 = c.hostname("node", 0)
        # the node to kill each time: the one in rank 1 then, which is the last spare seated
        victims = [c.hostname("node", 1 + k) for k in range(kills)]
        # timed from node 0's first step, not from the containers' start: a loaded machine
        # takes longer to start them, and a kill before the job trains measures nothing
        first = {"node": node0, "line": FIRST_STEP}
        faults = [
            Fault(f"kill{k}", (lambda v: lambda c: c.kill(v))(v), **first, delay=every * (k + 1))
            for k, v in enumerate(victims)
        ]
        ended: dict[str, float] = {}

        def end(c: FaultyCluster) -> None:
            """SIGTERM to node 0 once it trained again after the last kill: on a loaded machine
            the takeover can outlast the planned end, and a kill without its resume measures
            nothing. (10 minutes, a kill every 2: the planned end comes first.)"""
            last = c.fired(f"kill{kills - 1}") or 0.0
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not trained_since_resume(c.live[node0], last):
                time.sleep(0.5)
            ended["at"] = c.seconds()
            c.stop(node0, 25)

        faults.append(Fault("end", end, **first, delay=minutes * 60))
        run = c.run(
            specs(c, 2 + kills, 100_000, ENTRYPOINT_SPARES=str(kills)),
            timeout=minutes * 60 + 300,
            grace=float("inf"),
            faults=faults,
        )
        seen = steps_of(run, node0)
        if not seen:
            raise SystemExit(f"node 0 never trained:\n{run.log(60)}")
        cuts = [run.faults[f"kill{k}"] for k in range(kills)] + [ended["at"]]
        back = [first_step_after(run, node0, cut) for cut in cuts[:-1]]
        rates = []
        for start, stop in zip([seen[0][0], *back], cuts, strict=True):
            part = [(t, s) for t, s in seen if start <= t < stop]
            if len(part) > 1 and part[-1][0] > part[0][0]:
                rates.append((part[-1][1] - part[0][1]) / (part[-1][0] - part[0][0]))
        rate, end = max(rates), ended["at"]
        done = max(s for t, s in seen if t <= end)
        downtime = [b - cut for b, cut in zip(back, cuts, strict=False)]
        return done / (rate * (end - seen[0][0])), kills, rate, downtime


def restarts(image: str, client) -> None:
    for what, env in (
        ("spare takes the rank", {"ENTRYPOINT_SPARES": "1"}),
        ("shrink onto 2 nodes", {"ENTRYPOINT_MIN_NODES": "2"}),
    ):
        named, ended, go, step = elastic(image, client, 3, **env)
        print(
            f"{what:<24} {step:6.1f} s from the kill to node 0's next step: loss named "
            f"{named:.2f} s, the old workers gone {ended:.2f} s, every node joined and told to "
            f"start {go:.2f} s after the kill (the entrypoint's own share: "
            f"{named + go - ended:.2f} s)"
        )
    whole = platform_restart(image, client)
    print(f"platform restarts all    {whole:6.1f} s (containers started again, image local)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--image", default="multinode:dev")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--every", type=float, default=120)
    parser.add_argument("--skip-goodput", action="store_true")
    parser.add_argument("--only-goodput", action="store_true")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    import docker

    client = docker.from_env(timeout=120)
    if not args.only_goodput:
        restarts(args.image, client)
    if not args.skip_goodput:
        ratio, kills, rate, downtime = goodput(args.image, client, args.minutes, args.every)
        print(
            f"goodput                  {ratio * 100:6.1f} % of {args.minutes:g} min, a node killed "
            f"every {args.every:g} s ({kills} kills, spares enough; {rate:.1f} steps/s undisturbed)"
        )
        print("  each kill to the next step: " + ", ".join(f"{d:.1f} s" for d in downtime))


if __name__ == "__main__":
    main()
