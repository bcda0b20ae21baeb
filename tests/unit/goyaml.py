"""kubectl's YAML reader for the tests: tests/goyaml/yamlread.go, built against go-yaml v2 (the
YAML 1.1 rules kubectl reads manifests with; PyYAML's differ: it reads `1e-4` and `y` as
strings). Needs Debian's golang-go and golang-gopkg-yaml.v2-dev (.ci/run installs them); the
build is offline: GO111MODULE=off, GOPATH=/usr/share/gocode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "goyaml" / "yamlread.go"
GOPATH = "/usr/share/gocode"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def build(directory: Path) -> Path:
    """The reader's binary in directory; skip without Go (fail under CI=true)."""
    go = shutil.which("go")
    if go is None or not (Path(GOPATH) / "src" / "gopkg.in" / "yaml.v2").is_dir():
        why = "go-yaml v2 is not installed: apt-get install golang-go golang-gopkg-yaml.v2-dev"
        if IN_CI:
            pytest.fail(f"{why} (CI=true: the go-yaml tests must run, not skip)", pytrace=False)
        pytest.skip(why)
    binary = directory / "yamlread"
    env = os.environ | {"GO111MODULE": "off", "GOPATH": GOPATH, "GOFLAGS": "", "CGO_ENABLED": "0"}
    if "HOME" not in env and "GOCACHE" not in env:
        env["GOCACHE"] = str(directory / "go-build")
    subprocess.run(
        [go, "build", "-o", str(binary), str(SOURCE)],
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
    )
    return binary


def read(binary: Path, *paths: Path) -> list[list]:
    """Each file's documents as go-yaml v2 reads them, scalars typed (see yamlread.go)."""
    out = subprocess.run(
        [str(binary), *map(str, paths)], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.split("\n") if line]  # not at U+0085


def typed(value):
    """A PyYAML-read value in yamlread's typed form, to compare the two readers."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return {"!!int": str(value)}
    if isinstance(value, float):
        return {"!!float": repr(value)}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, dict):
        return {
            key if isinstance(key, str) else f"!!{type(key).__name__}:{key}": typed(item)
            for key, item in value.items()
        }
    return {f"!!{type(value).__name__}": str(value)}
