"""Pull the image from a real registry, as the nodes of a job do. Prints figures; asserts nothing.

    python benchmarks/pull.py [--image multinode:pull] [--runs 3] [--docker-runs 1] [--build]
    python benchmarks/pull.py --image multinode:dev --cold-only \
        --only "split, gzip" --only "split, zstd"

Three images side by side: today's (one venv layer, gzip; built from --today-ref, the last
commit with that Dockerfile), the split one (a layer per group, gzip) and the same split image
with zstd layers. Each is pushed to a registry on loopback (Debian's docker-registry,
distribution 2.8, on an empty directory), then pulled by a clean containerd (Debian's, with
`ctr`, 3 concurrent downloads as Kubernetes' CRI plugin does) --runs times, and by a clean
Docker engine (a second dockerd) --docker-runs times (gzip only: Docker 20.10 cannot pull
zstd). For each: the compressed total, the bytes the registry served for a cold pull and the
wall time to a pulled, unpacked image (median), then the bytes re-pulled by the node that has
it after (a) an entrypoint-only change and (b) a bump of JAX's pin.

The variants are images beside --image: IMAGE-today, IMAGE-today-ep, IMAGE-ep, IMAGE-jax (tags
derived from --image). --build builds those missing, each in a copy of the tree: -ep appends a
comment to entrypoint/__init__.py; -jax re-locks with JAX's pin moved to --jax (uv pip compile,
as `make lock` does, every other pin kept). Today's JAX bump is not built (it recompiles
DeepSpeed and takes another 9 GB): its one venv layer is built from the whole lock, so a
change of any pin replaces it and every layer above; that figure is read off its manifest.

Needs root (containerd, overlay mounts), docker-registry, containerd, ctr, skopeo, dockerd.
Disk: one image at a time, about 5 GB in the registry (or in memory, --registry-in-memory), 14 GB
in containerd, and skopeo's copy of `docker save` (9 GB in /var/tmp) while it pushes; all removed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GB, MB = 1e9, 1e6
# The last commit whose Dockerfile ships the venv as one layer.
TODAY_REF = "510c0d3b510b22600b1f51c768cb8a2a4fcff513"
MANIFESTS = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def docker_client() -> str:
    if os.environ.get("DOCKER"):
        return os.environ["DOCKER"]
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else "docker"


DOCKER = docker_client()


PACKAGES = "docker-registry containerd skopeo docker.io"


def image_exists(ref: str) -> bool:
    return subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True).returncode == 0


def sh(*argv: str, **kw) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, ready, timeout: float = 60, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not start in {timeout:.0f} s")


def stop(proc: subprocess.Popen | None, timeout: float = 60) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Registry:
    """distribution 2.8 on 127.0.0.1, storing under DIR; counts the bytes it serves."""

    def __init__(self, workdir: Path, memory: str | None = None):
        self.dir = workdir / "registry"
        self.memory = memory  # a tmpfs of this size holds the blobs, to spare the disk
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.log = workdir / "registry.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Registry:
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.memory:
            sh("mount", "-t", "tmpfs", "-o", f"size={self.memory}", "tmpfs", str(self.dir))
        config = self.dir.parent / "registry.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: info, formatter: json, accesslog: {disabled: true}}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.dir / 'data'}}}}}\n"
            f"http: {{addr: '{self.host}'}}\n"
        )
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        wait_for("docker-registry", self._answers, proc=self.proc)
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        stop(self.proc)
        if self.memory:
            subprocess.run(["umount", str(self.dir)], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_offset(self) -> int:
        return self.log.stat().st_size

    def served_since(self, offset: int) -> int:
        """Bytes of every GET answered since OFFSET of the log (manifests, configs, layers)."""
        total = 0
        with self.log.open() as f:
            f.seek(offset)
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("http.request.method") == "GET":
                    total += int(entry.get("http.response.written", 0))
        return total

    def manifest(self, ref: str) -> dict:
        repo, tag = ref.split("/", 1)[1].rsplit(":", 1)
        req = urllib.request.Request(
            f"http://{self.host}/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFESTS}
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)


def push(local: str, ref: str, compression: str, tmpdir: Path | None = None) -> float:
    """docker/push.sh (skopeo from the Docker engine): gzip in a Docker v2 manifest, zstd in an
    OCI one; skopeo's copy of the image under TMPDIR (push.sh's default: /var/tmp)."""
    start = time.perf_counter()
    env = {**os.environ, "IMAGE": local, "COMPRESSION": compression, "TLS_VERIFY": "false"}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    proc = subprocess.run(
        [str(REPO / "docker" / "push.sh"), ref], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"docker/push.sh {ref} (IMAGE={local}): {proc.stderr[-2000:]}")
    return time.perf_counter() - start


class Containerd:
    """A containerd of its own (root, state and socket under DIR), as clean as a new node's."""

    def __init__(self, workdir: Path):
        self.dir = workdir / "containerd"
        self.sock = str(self.dir / "containerd.sock")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Containerd:
        self.dir.mkdir(parents=True)
        config = self.dir / "config.toml"
        config.write_text(
            "version = 2\n"
            f'root = "{self.dir}/root"\n'
            f'state = "{self.dir}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.sock}"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{self.dir}/opt"\n'
        )
        self.proc = subprocess.Popen(
            ["containerd", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "containerd.log").open("w"),
        )
        wait_for("containerd", self._answers, proc=self.proc)
        return self

    def ctr(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ctr", "--address", self.sock, "--namespace", "bench", *args],
            capture_output=True,
            text=True,
            **kw,
        )

    def _answers(self) -> bool:
        return os.path.exists(self.sock) and self.ctr("version").returncode == 0

    def pull(self, ref: str) -> float:
        start = time.perf_counter()
        proc = self.ctr(
            "images",
            "pull",
            "--plain-http",
            "--max-concurrent-downloads",
            "3",
            "--platform",
            "linux/amd64",
            ref,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"ctr pull {ref}: {proc.stderr[-2000:]}")
        return time.perf_counter() - start

    def __exit__(self, *exc) -> None:
        stop(self.proc)
        for line in Path("/proc/mounts").read_text().splitlines():
            target = line.split()[1]
            if target.startswith(str(self.dir)):
                subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)


BRIDGE = "pullbench0"  # the second engine's bridge, created and deleted here


class Dockerd:
    """A second Docker engine (data root, exec root and socket under DIR), with no image."""

    def __init__(self, workdir: Path):
        self.dir = workdir / "dockerd"
        self.host = f"unix://{self.dir}/docker.sock"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Dockerd:
        self.dir.mkdir(parents=True)
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], check=True)
        self.proc = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(self.dir / "data"),
                "--exec-root",
                str(self.dir / "exec"),
                "--pidfile",
                str(self.dir / "docker.pid"),
                "--host",
                self.host,
                "--bridge",  # its own: with `none`, dockerd deletes docker0, the first engine's
                BRIDGE,
                "--iptables=false",
                "--ip-masq=false",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.dir / "dockerd.log").open("w"),
        )
        wait_for("dockerd", self._answers, proc=self.proc)
        return self

    def _answers(self) -> bool:
        proc = subprocess.run(
            [DOCKER, "-H", self.host, "info"], capture_output=True, check=False, timeout=30
        )
        return proc.returncode == 0

    def pull(self, ref: str) -> float:
        start = time.perf_counter()
        sh(DOCKER, "-H", self.host, "pull", "-q", ref)
        return time.perf_counter() - start

    def __exit__(self, *exc) -> None:
        stop(self.proc, timeout=120)
        for line in Path("/proc/mounts").read_text().splitlines():
            target = line.split()[1]
            if target.startswith(str(self.dir)):
                subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        subprocess.run(["ip", "link", "delete", BRIDGE], check=False)


@dataclass
class Figures:
    name: str
    layers: int = 0
    total: int = 0  # compressed bytes in the manifest
    push_s: float = 0.0
    cold_bytes: list[int] = field(default_factory=list)
    cold_s: list[float] = field(default_factory=list)
    docker_bytes: list[int] = field(default_factory=list)
    docker_s: list[float] = field(default_factory=list)
    ep_bytes: list[int] = field(default_factory=list)
    ep_s: list[float] = field(default_factory=list)
    jax_bytes: list[int] = field(default_factory=list)
    jax_s: list[float] = field(default_factory=list)
    jax_note: str = ""
    layer_sizes: list[int] = field(default_factory=list)


def median(values: list) -> float | None:
    return statistics.median(values) if values else None


def measure(
    name: str,
    images: dict[str, str | None],
    compression: str,
    workdir: Path,
    runs: int,
    docker_runs: int,
    memory: str | None,
) -> Figures:
    fig = Figures(name)
    with Registry(workdir, memory) as reg:
        refs = {}
        for variant, local in images.items():
            if local is None:
                continue
            refs[variant] = f"{reg.host}/multinode:{variant}-{compression}"
            seconds = push(local, refs[variant], compression)
            if variant == "base":
                fig.push_s = seconds
            print(f"  pushed {local} as {refs[variant]} ({seconds:.0f} s)", flush=True)
        manifest = reg.manifest(refs["base"])
        fig.layer_sizes = [layer["size"] for layer in manifest["layers"]]
        fig.layers = len(fig.layer_sizes)
        fig.total = sum(fig.layer_sizes) + manifest["config"]["size"]
        if "jax" not in refs and images.get("ep") is not None:
            # one venv layer (the first above 1 GB) and all above it change with any pin
            big = next(i for i, size in enumerate(fig.layer_sizes) if size > GB)
            fig.jax_bytes = [sum(fig.layer_sizes[big:])]
            fig.jax_note = "*"
        for run in range(runs):
            with Containerd(workdir) as node:
                offset = reg.log_offset()
                fig.cold_s.append(node.pull(refs["base"]))
                fig.cold_bytes.append(reg.served_since(offset))
                for variant, secs, got in (
                    ("ep", fig.ep_s, fig.ep_bytes),
                    ("jax", fig.jax_s, fig.jax_bytes),
                ):
                    if variant in refs:
                        offset = reg.log_offset()
                        secs.append(node.pull(refs[variant]))
                        got.append(reg.served_since(offset))
            print(
                f"  containerd run {run + 1}: cold {fig.cold_s[-1]:.1f} s "
                f"{fig.cold_bytes[-1] / GB:.2f} GB"
                + (
                    f"; after an entrypoint change {fig.ep_bytes[-1] / MB:.2f} MB"
                    if "ep" in refs
                    else ""
                )
                + (f"; after a JAX bump {fig.jax_bytes[-1] / GB:.3f} GB" if "jax" in refs else ""),
                flush=True,
            )
        if compression == "gzip":
            for run in range(docker_runs):
                with Dockerd(workdir) as engine:
                    offset = reg.log_offset()
                    fig.docker_s.append(engine.pull(refs["base"]))
                    fig.docker_bytes.append(reg.served_since(offset))
                print(f"  docker run {run + 1}: cold {fig.docker_s[-1]:.1f} s", flush=True)
    return fig


TODAY = "today: one venv layer, gzip"


def build_variants(image: str, jax: str, today_ref: str, today: bool = True) -> None:
    """Build the variant images that are missing, each in a copy of the tree (today's only
    when `today`)."""
    repo, _, tag = image.rpartition(":")

    def exists(ref: str) -> bool:
        return (
            subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True).returncode == 0
        )

    def build(tree: Path, ref: str) -> None:
        print(f"  building {ref} ...", flush=True)
        start = time.perf_counter()
        subprocess.run(
            [str(tree / "docker" / "build.sh")],
            check=True,
            env={**os.environ, "IMAGE": ref, "PROGRESS": "plain"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(f"  built {ref} in {time.perf_counter() - start:.0f} s", flush=True)

    def entrypoint_change(tree: Path) -> None:
        init = tree / "entrypoint" / "__init__.py"
        init.write_text(init.read_text() + "\n# pull benchmark: an entrypoint-only change\n")

    def jax_bump(tree: Path) -> None:
        req = tree / "docker" / "requirements.in"
        text, n = re.subn(r"(?m)^jax\[cuda12\]==\S+", f"jax[cuda12]=={jax}", req.read_text())
        if n != 1:
            raise SystemExit(f"{req}: no jax[cuda12]== pin to move")
        req.write_text(text)
        uv = shutil.which("uv", path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        sh(
            uv or "uv",
            "pip",
            "compile",
            "-q",
            "--generate-hashes",
            "--python-version",
            "3.13",
            "--python-platform",
            "x86_64-manylinux_2_28",
            "--custom-compile-command",
            "make lock",
            "pyproject.toml",
            "docker/requirements.in",
            "-o",
            "docker/requirements.lock",
            cwd=tree,
        )

    ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", ".hypothesis")
    with tempfile.TemporaryDirectory() as tmp:
        jobs = [
            (f"{repo}:{tag}-today", "today", None),
            (f"{repo}:{tag}-today-ep", "today", entrypoint_change),
            (f"{repo}:{tag}-ep", "split", entrypoint_change),
            (f"{repo}:{tag}-jax", "split", jax_bump),
        ]
        for ref, layout, change in jobs:
            if exists(ref) or (layout == "today" and not today):
                continue
            tree = Path(tmp) / ref.replace(":", "_")
            if layout == "split":
                shutil.copytree(REPO, tree, ignore=ignore)
            else:
                tree.mkdir()
                archive = subprocess.run(
                    ["git", "-C", str(REPO), "-c", "tar.umask=0022", "archive", today_ref],
                    check=True,
                    capture_output=True,
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            if change is not None:
                change(tree)
            build(tree, ref)


def cell(values: list, unit: float, fmt: str, note: str = "") -> str:
    m = median(values)
    return "-" if m is None else f"{m / unit:{fmt}}{note}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=os.environ.get("IMAGE", "multinode:pull"))
    parser.add_argument("--runs", type=int, default=3, help="cold containerd pulls per image")
    parser.add_argument("--docker-runs", type=int, default=1, help="cold Docker pulls per image")
    parser.add_argument("--build", action="store_true", help="build the missing variant images")
    parser.add_argument("--jax", default="0.12.0", help="JAX's pin in the -jax variant")
    parser.add_argument("--today-ref", default=TODAY_REF, help="commit of today's Dockerfile")
    parser.add_argument("--workdir", default="/tmp/pull-bench")
    parser.add_argument(
        "--only", action="append", help="measure this image only (its name in the table)"
    )
    parser.add_argument(
        "--cold-only",
        action="store_true",
        help="cold pulls of --image only: no re-pull variants built or measured",
    )
    parser.add_argument(
        "--registry-in-memory",
        dest="memory",
        metavar="SIZE",
        help="keep the registry's blobs in a tmpfs of SIZE (7g), not on the disk",
    )
    args = parser.parse_args()

    for tool in ("docker-registry", "containerd", "ctr", "skopeo", "dockerd"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"{tool}: not found (apt-get install docker-registry containerd skopeo)"
            )
    with_today = not args.only or TODAY in args.only
    if args.build and not args.cold_only:
        build_variants(args.image, args.jax, args.today_ref, with_today)
    repo, _, tag = args.image.rpartition(":")
    today = {"base": f"{repo}:{tag}-today", "ep": f"{repo}:{tag}-today-ep", "jax": None}
    split = {"base": args.image, "ep": f"{repo}:{tag}-ep", "jax": f"{repo}:{tag}-jax"}
    if args.cold_only:
        split = {"base": args.image, "ep": None, "jax": None}
    for ref in [*(today.values() if with_today else ()), *split.values()]:
        if (
            ref
            and subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True).returncode
        ):
            raise SystemExit(f"{ref}: not built (run with --build)")

    workdir = Path(args.workdir)
    if workdir.exists():
        raise SystemExit(f"{workdir}: exists; remove it, or pass another --workdir")
    workdir.mkdir(parents=True)
    results = []
    try:
        for name, images, compression in (
            (TODAY, today, "gzip"),
            ("split, gzip", split, "gzip"),
            ("split, zstd", split, "zstd"),
        ):
            if args.only and name not in args.only:
                continue
            print(f"{name}", flush=True)
            results.append(
                measure(
                    name, images, compression, workdir, args.runs, args.docker_runs, args.memory
                )
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"\nregistry on loopback, {args.runs} cold containerd pulls per image (medians), "
        f"{args.docker_runs} Docker:"
    )
    rows = [
        ("layers", lambda f: str(f.layers)),
        ("compressed total, GB", lambda f: f"{f.total / GB:.2f}"),
        ("largest layer, GB", lambda f: f"{max(f.layer_sizes) / GB:.2f}"),
        ("push (skopeo), s", lambda f: f"{f.push_s:.0f}"),
        ("containerd cold pull: GB served", lambda f: cell(f.cold_bytes, GB, ".2f")),
        ("containerd cold pull: s to unpacked", lambda f: cell(f.cold_s, 1, ".0f")),
        ("Docker 20.10 cold pull: s to unpacked", lambda f: cell(f.docker_s, 1, ".0f")),
        ("re-pull after an entrypoint change: MB", lambda f: cell(f.ep_bytes, MB, ".2f")),
        ("re-pull after an entrypoint change: s", lambda f: cell(f.ep_s, 1, ".1f")),
        ("re-pull after a JAX bump: GB", lambda f: cell(f.jax_bytes, GB, ".3f", f.jax_note)),
        ("re-pull after a JAX bump: s", lambda f: cell(f.jax_s, 1, ".1f")),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"{'':{width}}  " + "  ".join(f"{f.name:>28}" for f in results))
    for label, get in rows:
        print(f"{label:{width}}  " + "  ".join(f"{get(f):>28}" for f in results))
    print(
        "* not built: the one venv layer is built from the whole lock, so a JAX bump replaces"
        " it and every layer above; the sum of those layers' sizes in the manifest"
    )
    print("per-layer compressed MB, bottom to top:")
    for f in results:
        print(f"  {f.name}: " + " ".join(f"{s / MB:.1f}" for s in f.layer_sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
