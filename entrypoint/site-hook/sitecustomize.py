"""Put first on PYTHONPATH by the entrypoint for the jax and direct launchers (see
entrypoint/jax_cluster.py): registers the plan's JAX cluster environment, then runs the
sitecustomize this file shadows, if there is one, and leaves sys.path as it found it."""

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
    from entrypoint import jax_cluster

    jax_cluster.install()
except Exception as err:  # never stop the trainer's interpreter from starting
    print(f"entrypoint: site hook: {type(err).__name__}: {err}", file=sys.stderr)
