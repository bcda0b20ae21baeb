"""The pull policy the Kubernetes renderers write: IfNotPresent for a tag that is never moved or
a digest, Always for `:latest` or no tag (Kubernetes' own default for those,
https://kubernetes.io/docs/concepts/containers/images/#imagepullpolicy-defaulting)."""

from __future__ import annotations

import pytest

from entrypoint.render import text

DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("ghcr.io/example/multinode:1.0", "IfNotPresent"),
        ("multinode:lock-3f2a9c", "IfNotPresent"),
        ("localhost:5000/multinode:2", "IfNotPresent"),
        (f"ghcr.io/example/multinode@{DIGEST}", "IfNotPresent"),
        (f"multinode:latest@{DIGEST}", "IfNotPresent"),
        ("multinode", "Always"),
        ("multinode:latest", "Always"),
        ("localhost:5000/multinode", "Always"),
        ("registry.example.com:443/team/multinode:latest", "Always"),
    ],
)
def test_pull_policy(image, policy):
    assert text.pull_policy(image) == policy
