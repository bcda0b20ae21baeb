"""What is in the image's layers: one copy of each NVIDIA library, no build secret, no
credential and no variable named like a secret (entrypoint/plan/secrets.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import tarfile
from pathlib import Path

from entrypoint.plan.secrets import is_secret

from .image_helpers import CUDA

# The CUDA user-space libraries torch and JAX load; each must exist exactly once.
CUDA_LIB = re.compile(
    r"^lib(cudart|cublas|cublasLt|cudnn\w*|nccl|cufft|cufftw|curand|cusolver|cusolverMg|cusparse"
    r"|cusparseLt|nvJitLink|nvrtc|nvrtc-builtins|cupti|nvshmem\w*|nvToolsExt|cufile)\.so(\.\d+)*$"
)


def test_one_copy_of_each_nvidia_library(image):
    out = image.python(
        "import importlib.metadata as md, os, re, sys\n"
        "print('DIST', *sorted(d.metadata['Name'].lower().replace('_', '-')\n"
        "                      for d in md.distributions()))\n"
        "for root, _, files in os.walk('/'):\n"
        "    if root.startswith(('/proc', '/sys', '/dev')): continue\n"
        "    for f in files:\n"
        "        if '.so' in f: print('SO', os.path.join(root, f))\n"
    )
    dists = next(line.split()[1:] for line in out.splitlines() if line.startswith("DIST "))
    assert len(dists) == len(set(dists)), "a distribution is installed twice"
    nvidia = [d for d in dists if d.startswith("nvidia-") and d != "nvidia-ml-py"]
    # nvidia-nccl-cu12 and nvidia-nccl-cu13 (or an unsuffixed nvidia-nccl) would be two NCCLs
    families = [re.sub(r"-cu\d+$", "", d) for d in nvidia]
    assert len(families) == len(set(families)), nvidia
    if CUDA == "12":
        assert all(d.endswith("-cu12") for d in nvidia if d != "nvidia-cuda-pathfinder"), nvidia
    else:  # CUDA 13's toolkit wheels have no suffix; cuDNN, NCCL, NVSHMEM, cuSPARSELt do
        assert not [d for d in nvidia if re.search(r"-cu(?!13$)\d+$", d)], nvidia
    libs: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("SO "):
            path = line[3:]
            if CUDA_LIB.match(os.path.basename(path)):
                libs.setdefault(os.path.basename(path), []).append(path)
    assert "libnccl.so.2" in libs and "libcudnn.so.9" in libs, sorted(libs)
    # Triton's proton profiler carries private CUPTIs (lib/cupti; with CUDA 13's Triton also
    # lib/cupti-blackwell, its knobs.py's path for Blackwell), loaded only when profiling with
    # triton.profiler; torch and JAX load the CUDA wheels' one.
    libs = {
        name: [p for p in paths if not re.search(r"/triton/backends/nvidia/lib/cupti[-/]", p)]
        for name, paths in libs.items()
    }
    twice = {name: paths for name, paths in libs.items() if len(paths) > 1}
    assert not twice, twice
    # the CUDA libraries come from the wheels only, never from Debian packages
    assert not [p for paths in libs.values() for p in paths if p.startswith("/usr/lib")], libs


def _host_ca_bundle() -> Path | None:
    """The bundle docker/build.sh passes as the build secret (same search order)."""
    for var in ("CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        path = os.environ.get(var)
        if path and path != "none" and os.path.isfile(path):
            return Path(path)
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"):
        if os.path.isfile(path):
            return Path(path)
    return None


def _pem_bodies(pem: bytes) -> set[bytes]:
    """The first base64 line of every certificate: enough to recognise it anywhere."""
    return {m.split(b"\n")[1] for m in re.findall(rb"-----BEGIN CERTIFICATE-----\r?\n[^\n]+", pem)}


SMALL = 4 << 20  # certificates and secrets are small; the big .so files are skipped


def _overlay_dirs(docker: str, tag: str) -> list[str] | None:
    """The image's layer folders, top first, where the engine keeps them in overlay2 and this
    test can read them (root, on the engine's machine); else None."""
    driver = json.loads(
        subprocess.run(
            [docker, "image", "inspect", "--format", "{{json .GraphDriver}}", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    data = driver.get("Data") or {}
    dirs = [d for key in ("UpperDir", "LowerDir") for d in (data.get(key) or "").split(":") if d]
    readable = dirs and all(os.access(d, os.R_OK | os.X_OK) for d in dirs)
    return dirs if driver.get("Name") == "overlay2" and readable else None


def _layer_members(docker: str, tag: str, dirs: list[str] | None):
    """(layer, name, content or None) for every entry of every layer, and (layer, None, None)
    first for each layer, empty ones (WORKDIR's) included: from the layer folders `dirs` when
    given (3 s for the CUDA 12 image here), else from `docker save` (112 s, 2026-11-28)."""
    if dirs is not None:
        yield from _overlay_members(dirs)
    else:
        yield from _saved_members(docker, tag)


def _overlay_members(dirs: list[str]):
    for layer in dirs:
        yield layer, None, None
        for root, subdirs, files in os.walk(layer):
            for name in subdirs + files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                if stat.S_ISCHR(st.st_mode):  # a whiteout: a file the layer deletes
                    continue
                content = None
                if stat.S_ISREG(st.st_mode) and st.st_size < SMALL:
                    with open(path, "rb") as f:
                        content = f.read()
                yield layer, os.path.relpath(path, layer), content


def _saved_members(docker: str, tag: str):
    proc = subprocess.Popen([docker, "save", tag], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for blob in outer:
            if not blob.isfile() or blob.name.endswith((".json", "repositories", "oci-layout")):
                continue
            try:
                layer = tarfile.open(fileobj=outer.extractfile(blob), mode="r|*")  # noqa: SIM115
            except tarfile.TarError:
                continue
            with layer:
                yield blob.name, None, None
                for member in layer:
                    content = None
                    if member.isfile() and member.size < SMALL:
                        content = layer.extractfile(member).read()
                    yield blob.name, member.name, content
    assert proc.wait() == 0, "docker save failed"


# Files that hold credentials: netrc (wandb, pip), git's store, the Hugging Face token, PyPI's
# and Docker's configs. None belongs in an image: they come from the platform's secrets at run.
CREDENTIAL_FILE = re.compile(
    r"(^|/)(\.netrc|_netrc|\.git-credentials|\.pypirc|huggingface/token|"
    r"\.docker/config\.json)$"
)


def _secret_values_here() -> list[bytes]:
    """Values of this shell's secret-named variables (a CI token, a developer's HF_TOKEN): the
    build ran beside them, and none may have reached a layer."""
    return [v.encode() for k, v in os.environ.items() if is_secret(k) and len(v) >= 8]


def test_no_secret_named_variable_in_the_config_or_a_build_argument(image, docker):
    """ENV and ARG values stay in the image for anyone who pulls it (`docker inspect`,
    `docker history`): none may be named like a secret (HF_TOKEN, *_KEY, *PASSWORD*...)."""
    env = [e.split("=", 1)[0] for e in image.config["Config"].get("Env") or []]
    assert not [name for name in env if is_secret(name)], env
    history = subprocess.run(
        [docker, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image.tag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    named = set(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)=", history))
    assert not [name for name in named if is_secret(name)], sorted(named)


def test_no_ca_bundle_and_no_secret_in_any_layer(image, docker):
    host_ca = _host_ca_bundle()
    host_pem = host_ca.read_bytes() if host_ca is not None else b""  # none: no CA secret given
    # the image's own public roots: Debian's bundle and pip's vendored certifi
    image_pem = b""
    if host_ca is not None:
        image_pem = image.run(
            "/etc/ssl/certs/ca-certificates.crt", entrypoint="cat"
        ).stdout.encode()
        image_pem += image.python(
            "import os, pip._vendor.certifi as c;"
            "print(open(os.path.join(os.path.dirname(c.__file__), 'cacert.pem')).read())"
        ).encode()
    # The certificates only the host trusts (a corporate or proxy CA): none may be in a layer.
    own = _pem_bodies(host_pem) - _pem_bodies(image_pem)
    host_sha = hashlib.sha256(host_pem).hexdigest()
    same_as_image = _pem_bodies(host_pem) <= _pem_bodies(image_pem)
    values = _secret_values_here()
    found, layers = [], set()
    dirs = _overlay_dirs(docker, image.tag)
    for layer, name, content in _layer_members(docker, image.tag, dirs):
        layers.add(layer)
        if name is None:
            continue
        # BuildKit leaves the empty mount point run/secrets/ in a layer: entries under it are not
        if re.search(r"(^|/)run/secrets/.", name) or name.endswith(("with-ca.sh", "99-build-ca")):
            found.append(f"{layer}: {name}")
        if CREDENTIAL_FILE.search(name):
            found.append(f"{layer}: {name} is a credential file")
        if content is None:
            continue
        if any(value in content for value in values):
            found.append(f"{layer}: {name} holds the value of a secret variable of this shell")
        if not same_as_image and hashlib.sha256(content).hexdigest() == host_sha:
            found.append(f"{layer}: {name} is the host's CA bundle")
        for body in own:
            if body in content:
                found.append(f"{layer}: {name} holds a certificate from {host_ca}")
                break
    # every layer of the image was read: the venv's groups, the project, the base
    # (a folder for each layer; `docker save` writes two identical layers once)
    diff_ids = image.config["RootFS"]["Layers"]
    assert len(layers) == (len(diff_ids) if dirs is not None else len(set(diff_ids))), layers
    assert not found, found
    history = subprocess.run(
        [docker, "history", "--no-trunc", image.tag], capture_output=True, text=True, check=True
    ).stdout
    assert not [b for b in own if b.decode() in history]


def test_no_layer_holds_40_percent_of_the_image(image, docker):
    """A cold pull waits for its largest layer: the CUDA wheels were one layer, 54% (issue 23)."""
    sizes = [
        int(size)
        for size in subprocess.run(
            [docker, "history", "--human=false", "--format", "{{.Size}}", image.tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    ]
    assert max(sizes) <= 0.40 * sum(sizes), sorted(sizes, reverse=True)[:4]
