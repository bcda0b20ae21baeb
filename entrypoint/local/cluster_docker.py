"""The Docker SDK as the local cluster uses it, imported lazily: the entrypoint inside the image
never loads it (`sdk()` says how to install it when missing). Reading a stopped container's
results, and removing objects that may be gone already."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from collections.abc import Callable

from entrypoint.plan.errors import ConfigError

# Where the built-in job writes when ENTRYPOINT_JOB_OUTPUT is unset (entrypoint/job/common.py).
DEFAULT_OUTPUT = "/tmp/entrypoint-job"


def read_results(container, output: str = DEFAULT_OUTPUT) -> list[dict]:
    """The rank<R>.json files in <output>/results of a container (running or stopped), read
    through the Docker API, so no host directory or uid has to match."""
    from docker.errors import APIError, NotFound

    try:
        stream, _ = container.get_archive(f"{output}/results")
    except (NotFound, APIError):
        return []  # no results directory: the job never got that far
    data = io.BytesIO(b"".join(stream))
    found = []
    with tarfile.open(fileobj=data) as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base.startswith("rank") and base.endswith(".json"):
                file = tar.extractfile(member)  # a regular file: never None
                if file is not None:
                    found.append(json.loads(file.read()))
    return found


def remove_quietly(what: str, remove: Callable[[], None]) -> None:
    """Remove one Docker object; gone already is fine, anything else is said, never raised."""
    from docker.errors import APIError, NotFound

    try:
        remove()
    except NotFound:
        pass
    except APIError as err:
        print(f"cluster: could not remove {what}: {err}", file=sys.stderr)


def sdk():
    """The Docker SDK, or a one-line error saying how to get it."""
    try:
        import docker
    except ImportError:
        raise ConfigError(
            "docker",
            None,
            "the Docker SDK for Python is not installed",
            "pip install 'multinode-entrypoint[local]' (or pip install docker)",
        ) from None
    return docker
