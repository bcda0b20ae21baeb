"""Turn the environment a platform gives one node into a launch plan, then start the trainer."""

import signal

__version__ = "0.1.0"

# Exit codes a platform's retry policy can key on (entrypoint.plan.errors raises them; the
# trainer's side reads them too). Otherwise: the trainer's own exit code, or 128 + N after signal
# N (143: SIGTERM, preempted).
EXIT_CONFIG = 2  # configuration error found before launch: retrying will not help
EXIT_PEERS = 75  # the master or a peer is unavailable, lost or silent: a retry may succeed
EXIT_HUNG = 124  # ranks stopped stepping (ENTRYPOINT_HANG_TIMEOUT): one hangs, named with its stack

# The signals that end a job (every node checkpoints and stops); USR1 and USR2 are passed on and
# the job goes on. Node 0's mind, the node's supervisor and its workers' signals all read this.
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def signal_name(number: int) -> str:
    """`SIGTERM`, or `signal 64` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# The stopping signals `python -m entrypoint` took before a command had handlers of its own
# (entrypoint/__main__.py). Its handler raises, and Python drops an exception raised where it
# cannot propagate (a __del__, a finalizer: "Exception ignored in ..."); `run` takes what is
# recorded here as received, so that such a signal is never lost.
early_signals: list[int] = []
