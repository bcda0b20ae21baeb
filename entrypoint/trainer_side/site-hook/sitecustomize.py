"""Put first on the trainer's PYTHONPATH by the entrypoint: runs the sitecustomize this file
shadows, if there is one, leaves sys.path as it found it, then adapts libraries the trainer may
import, each only once the trainer imports it: JAX's cluster detection reads the plan
(trainer_side/jax_cluster.py); accelerate on CPU nodes (trainer_side/accelerate_cpu.py); every
rank's steps reported to the node's entrypoint (trainer_side/step_hook.py); the world the
trainer forms checked against the plan (trainer_side/world_check.py); a launcher started inside
the command adopted or stopped in one line (trainer_side/inner_launcher.py); and lets gloo's
threads finish before the interpreter is torn down (trainer_side/exit_guard.py)."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
_SELF = sys.modules.pop(__name__)
try:
    import sitecustomize  # noqa: F401  the one this file shadows
except ImportError as err:
    if err.name != "sitecustomize":
        raise
finally:  # the import that is running this file expects a module under its name
    sys.modules.setdefault(__name__, _SELF)
try:
    from entrypoint.trainer_side import (
        accelerate_cpu,
        exit_guard,
        inner_launcher,
        jax_cluster,
        step_hook,
        world_check,
    )

    inner_launcher.install()  # first: a launcher inside the command adopted, or it goes no further
    exit_guard.install()  # first registered, so it runs after the trainer's own exit handlers
    jax_cluster.install()
    accelerate_cpu.install()
    step_hook.install()
    world_check.install()
except Exception as err:  # never stop the trainer's interpreter from starting
    print(f"entrypoint: site hook: {type(err).__name__}: {err}", file=sys.stderr)
