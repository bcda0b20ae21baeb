"""Text shared by the renderers: comment headers, and YAML with comments put in as text.

The YAML is written here, not by a YAML library: PyYAML writes no comments and quotes by YAML
1.1 as PyYAML reads it (`1e-4`, `y` stay plain, which kubectl's go-yaml reads as a float and a
boolean). A document is written first and each note is then put above the first line (after the
previous note's) that starts with its key: stable, golden-testable text.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from entrypoint.consensus.embedded import cluster_size
from entrypoint.plan.values import ETCD_OFF, PREFIX
from entrypoint.render import quote

if TYPE_CHECKING:
    from entrypoint.render.request import Request

GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's resource name
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
NOTE_WIDTH = 100
# A Secret's keys are the variable names; the value never appears in a spec.
SECRET_HINT = "kubectl create secret generic {secret}{ns} {literals}"


def comment(lines: Sequence[str]) -> str:
    return "".join(f"# {line}".rstrip() + "\n" for line in lines)


def count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def shape(request: Request, noun: str = "node") -> str:
    """`2 nodes x 8 GPUs`, `2 CPU nodes`, `2 nodes + 1 spare x 8 GPUs`."""
    spares = f" + {count(request.spares, 'spare')}" if request.spares else ""
    if request.gpus_per_node:
        return f"{count(request.nodes, noun)}{spares} x {count(request.gpus_per_node, 'GPU')}"
    return count(request.nodes, f"CPU {noun}") + spares


def node0_survives(request: Request) -> str | None:
    """Where node 0's seat lives when a survivor can take it over (ENTRYPOINT_ETCD, or the
    job's own etcd on 3 of its nodes, with spares or a minimum); None: node 0's loss ends the
    job (entrypoint.supervise.takeover.survival says the same at the start)."""
    etcd = (dict(request.env).get(f"{PREFIX}ETCD") or "").strip()
    if not request.elastic or etcd.lower() == ETCD_OFF:
        return None
    if etcd:
        return f"the etcd {PREFIX}ETCD names"
    own = cluster_size(request.machines)
    return f"the job's own etcd, on {own} of its nodes" if own else None


def when_a_node_dies(request: Request, platform_part: str, node0_back: str) -> list[str]:
    """The header's lines on a lost node, with spares or a minimum (none without them);
    `node0_back`: what the platform does with a lost node 0 once a survivor took its seat."""
    if not request.elastic:
        return []
    lines = ["When a node dies:"]
    if request.spares:
        lines.append(
            f"  a standby (of {request.spares}) takes its rank and every node's trainer "
            "restarts from its last checkpoint;"
        )
    if request.min_nodes is not None:
        lines.append(
            f"  with no standby left, the job restarts on the survivors while {request.min_nodes} "
            "or more are alive;"
        )
    seat = node0_survives(request)
    if seat is None:
        node0 = [
            "  node 0's loss ends the job on every node (75): it holds the rendezvous (3 "
            f"nodes, or {PREFIX}ETCD, would let a survivor take its place)."
        ]
    else:
        node0 = [
            f"  node 0's loss costs a restart: a survivor takes its seat ({seat});",
            f"  {node0_back}",
        ]
    return [*lines, f"  {platform_part}", *node0]


def header(request: Request, title: str, lines: Sequence[str] = ()) -> list[str]:
    """The opening lines every spec starts with: what it is and how to get it again."""
    return [title, f"Rendered by: {request.command_line()}", *lines]


def annotate(text: str, notes: Sequence[tuple[str, str]]) -> str:
    """Put `# note` above the first line, at or after the previous note's, starting with key."""
    lines = text.splitlines()
    out: list[str] = []
    position = 0
    for key, note in notes:
        for index in range(position, len(lines)):
            stripped = lines[index].lstrip()
            if stripped.startswith(key):
                out += lines[position:index]
                indent = lines[index][: len(lines[index]) - len(stripped)]
                width = max(40, NOTE_WIDTH - len(indent) - 2)
                out += [f"{indent}# {line}" for line in textwrap.wrap(note, width)]
                position = index
                break
        else:
            raise AssertionError(f"no line starts with {key!r} after line {position}")
    return "\n".join(out + lines[position:]) + "\n"


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return quote.yaml_str(value)
    raise TypeError(f"no YAML form for {value!r}")


def _yaml_value(value: object) -> str | None:
    """The text after `key: ` when the value fits on the key's line, else None."""
    if isinstance(value, dict):
        return None if value else "{}"
    if isinstance(value, list):
        # A list of words (a command, plugin flags) reads best on one line.
        if all(isinstance(item, str) for item in value):
            return "[" + ", ".join(quote.yaml_str(item) for item in value) + "]"
        return None
    return _yaml_scalar(value)


def _yaml_mapping(mapping: dict, indent: int) -> list[str]:
    """Block YAML, list items indented under their key as kubectl and the Kubernetes docs do."""
    pad = " " * indent
    lines = []
    for key, value in mapping.items():
        name = quote.yaml_str(key)
        inline = _yaml_value(value)
        if inline is not None:
            lines.append(f"{pad}{name}: {inline}")
        elif isinstance(value, dict):
            lines += [f"{pad}{name}:", *_yaml_mapping(value, indent + 2)]
        else:
            lines.append(f"{pad}{name}:")
            for item in value:
                if isinstance(item, dict) and item:
                    first, *rest = _yaml_mapping(item, indent + 4)
                    lines += [f"{pad}  - {first.lstrip()}", *rest]
                else:
                    lines.append(f"{pad}  - {_yaml_value(item)}")
    return lines


def yaml_document(body: dict) -> str:
    """One mapping as YAML text: every string that is not a plain identifier double-quoted
    (entrypoint/render/quote.py), so that kubectl's YAML 1.1 reader sees the same values."""
    return "\n".join(_yaml_mapping(body, 0)) + "\n"


def yaml_documents(
    documents: Sequence[tuple[dict, Sequence[tuple[str, str]]]], opening: Sequence[str]
) -> str:
    """A multi-document YAML stream: the opening comment, then each (object, notes)."""
    parts = [annotate(yaml_document(body), notes) for body, notes in documents]
    return comment(opening) + "---\n".join(parts)


# The control channel's job identity and token (entrypoint/control/identity.py): the job's name, and
# a token from a Secret the user creates once per job (required: a pod waits for it; with `--token
# optional` a pod starts without it and only the identity is checked).
JOB_ID, JOB_TOKEN, TOKEN_KEY = "ENTRYPOINT_JOB_ID", "ENTRYPOINT_JOB_TOKEN", "token"
TOKEN_COMMAND = "openssl rand -hex 32"


def control_secret(request: Request) -> str:
    return f"{request.name}-control"


def kube_env(request: Request, fixed: Sequence[tuple[str, str]] = ()) -> list[dict]:
    """Container env: what the platform cannot say, the job's identity and control token, then
    --env; secrets from the Secret."""
    entries: list[dict] = [{"name": key, "value": value} for key, value in fixed]
    entries += [
        {"name": JOB_ID, "value": request.name},
        {
            "name": JOB_TOKEN,
            "valueFrom": {
                "secretKeyRef": {
                    "name": control_secret(request),
                    "key": TOKEN_KEY,
                }
                | ({"optional": True} if request.token == "optional" else {})
            },
        },
    ]
    for key, value in request.env:
        if value is None:
            entries.append(
                {"name": key, "valueFrom": {"secretKeyRef": {"name": request.secret, "key": key}}}
            )
        else:
            entries.append({"name": key, "value": value})
    return entries


def kube_container(
    request: Request,
    name: str,
    fixed_env: Sequence[tuple[str, str]] = (),
    ports: Sequence[dict] = (),
) -> dict:
    """The node's container: the image's entrypoint with `run`, GPUs as limits, /dev/shm."""
    container: dict = {
        "name": name,
        "image": request.image,
        "imagePullPolicy": pull_policy(request.image),
        "args": request.entrypoint_args(),
    }
    env = kube_env(request, fixed_env)
    if env:
        container["env"] = env
    if ports:
        container["ports"] = list(ports)
    if request.gpus_per_node:
        container["resources"] = {"limits": {GPU_RESOURCE: request.gpus_per_node}}
    container["volumeMounts"] = [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    return container


def moving_tag(image: str) -> bool:
    """`:latest` or no tag (which means latest), and no digest: a tag that is moved."""
    if "@" in image:
        return False
    name = image.rsplit("/", 1)[-1]
    return ":" not in name or name.endswith(":latest")


def pull_policy(image: str) -> str:
    """IfNotPresent for a tag that is never moved (or a digest): a node that holds it starts
    the pod without asking the registry. Always for a moving tag, Kubernetes' own default."""
    return "Always" if moving_tag(image) else "IfNotPresent"


def pull_note(image: str) -> str:
    if moving_tag(image):
        return (
            "A moving tag: every pod start asks the registry. Push each build under its own "
            "tag, and nodes that hold it start at once (IfNotPresent)."
        )
    return (
        "A node that holds this tag starts its pod without asking the registry: push each "
        "build under a new tag, never move one."
    )


def shm_volume() -> dict:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}


def kube_pod_spec(container: dict, restart: str | None = "Never", **more: Any) -> dict:
    """A pod of one container with /dev/shm in memory; restart None: the operator decides."""
    spec = {**more, "restartPolicy": restart} if restart else dict(more)
    return spec | {"containers": [container], "volumes": [shm_volume()]}


def kube_metadata(request: Request) -> dict:
    meta = {"name": request.name}
    if request.namespace:
        meta["namespace"] = request.namespace
    return meta


def kube_notes(request: Request) -> list[str]:
    """Opening lines every Kubernetes spec shares: how to apply it, where secrets come from."""
    ns = f" -n {request.namespace}" if request.namespace else ""
    lines = [
        f"Apply: kubectl apply{ns} -f FILE",
        (
            f"Control token (only this job's pods can join node 0): before applying, once: "
            f"kubectl create{ns} secret generic {control_secret(request)} "
            f'--from-literal={TOKEN_KEY}="$({TOKEN_COMMAND})"'
        ),
        (
            "Without that Secret the pods start anyway, and any pod that reaches node 0 with "
            "the job's name may join (rendered with --token optional)"
            if request.token == "optional"
            else "Without that Secret the pods do not start (CreateContainerConfigError) until "
            "it exists (render with --token optional to run without one)"
        ),
    ]
    if request.secrets:
        literals = " ".join(f"--from-literal={key}=..." for key in request.secrets)
        lines += [
            (
                f"{', '.join(request.secrets)}: secret, read from the Secret {request.secret} "
                "and never written here. Create it first:"
            ),
            "  " + SECRET_HINT.format(secret=request.secret, ns=ns, literals=literals),
        ]
    return lines


ENV_NOTES = {
    "shm": "NCCL and DataLoader workers share memory through /dev/shm; a container's default "
    "is 64 MiB.",
    "gpu": "The device plugin gives the container this many GPUs; the entrypoint starts one "
    "worker per GPU it sees.",
}
