"""The Docker SDK as the local cluster uses it, imported lazily: the entrypoint inside the image
never loads it (`sdk()` says how to install it when missing). Reading a stopped container's
results, removing objects that may be gone already, and never losing one that dockerd made."""

from __future__ import annotations

import functools
import io
import json
import signal
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING

from entrypoint.job.harness import DEFAULT_OUTPUT
from entrypoint.plan.errors import ConfigError

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.containers import Container

# Where the built-in job writes when ENTRYPOINT_JOB_OUTPUT is unset (entrypoint/job/harness.py).


def read_results(container: Container, output: str = DEFAULT_OUTPUT) -> list[dict]:
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


@contextmanager
def held_signals() -> Iterator[None]:
    """Around a call that makes a Docker object: a Ctrl-C or SIGTERM that comes during it is
    raised once it returns and its object is recorded. Raised in the middle, the call would be
    abandoned while dockerd still made the object, and nothing here would know to remove it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {
        number: signal.signal(number, lambda signum, _frame: held.append(signum))
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            if handler is not None:  # None: a handler set outside Python, left as it is
                signal.signal(number, handler)
    if held:
        raise KeyboardInterrupt(held[0])


def sweep(client: DockerClient, label: str) -> None:
    """Remove whatever still carries `label` (`key=value`): an object dockerd made for a call
    that never returned (a signal outside `held_signals`, a client timeout). Never raises."""
    mine = {"label": label}
    # ignore_removed: one that goes while listed (its own --rm, another sweep) is not an error
    found = functools.partial(client.containers.list, all=True, filters=mine, ignore_removed=True)
    _sweep("container", found, force=True, v=True)
    _sweep("network", lambda: client.networks.list(filters=mine))
    _sweep("volume", lambda: client.volumes.list(filters=mine), force=True)


def _sweep(kind: str, listed: Callable[[], list], **removal: bool) -> None:
    try:
        found = listed()
    except Exception as err:  # noqa: BLE001 - said; the other kinds are still swept
        print(f"cluster: could not list the {kind}s to sweep: {err}", file=sys.stderr)
        return
    for obj in found:
        remove_quietly(f"{kind} {obj.name}", functools.partial(obj.remove, **removal))


def sdk() -> ModuleType:
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
