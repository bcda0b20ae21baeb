"""The request `entrypoint render` builds: checked once, secrets by name only, and the command
line each spec quotes gives that spec again."""

import shlex

import pytest
from render_cases import GOLDEN, rendered

from entrypoint.cli import main
from entrypoint.plan.errors import ConfigError
from entrypoint.render import TARGETS, render
from entrypoint.render.request import build
from entrypoint.render.slurm import apptainer_image, pyxis_image

BASE = {"nodes": "2", "gpus_per_node": "1", "image": "img"}


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_the_quoted_command_renders_the_same_spec(case, capsys):
    text = rendered(case)
    line = next(line for line in text.splitlines() if "Rendered by: " in line)
    argv = shlex.split(line.split("Rendered by: ", 1)[1])
    assert argv[:2] == ["entrypoint", "render"]
    assert main(argv[1:]) == 0
    assert capsys.readouterr().out == text


@pytest.mark.parametrize("platform", TARGETS)
def test_no_secret_value_reaches_a_request_or_a_spec(platform):
    request = build(
        platform,
        **BASE,
        master_addr="10.0.0.1" if platform == "docker" else None,
        env=["HF_TOKEN=hf_s3cr3t", "DB_PASSWORD=pw12345", "NCCL_DEBUG=INFO"],
    )
    assert request.env == (("HF_TOKEN", None), ("DB_PASSWORD", None), ("NCCL_DEBUG", "INFO"))
    text = render(request)
    assert "hf_s3cr3t" not in text and "pw12345" not in text
    assert "HF_TOKEN" in text and "DB_PASSWORD" in text and "INFO" in text


@pytest.mark.parametrize(
    ("platform", "options", "variable"),
    [
        ("nomad", {}, "PLATFORM"),
        ("kubernetes", {"runtime": "pyxis"}, "--runtime"),
        ("trainjob", {"master_port": "29400"}, "--master-port"),
        ("slurm", {"namespace": "ml"}, "--namespace"),
        ("volcano", {"master_addr": "10.0.0.1"}, "--master-addr"),
    ],
)
def test_what_a_platform_does_not_take_is_refused(platform, options, variable):
    with pytest.raises(ConfigError) as err:
        build(platform, **BASE, **options)
    assert err.value.variable == variable


@pytest.mark.parametrize(
    ("image", "pyxis", "apptainer"),
    [
        (
            "ghcr.io/org/multinode:1.0",
            "ghcr.io#org/multinode:1.0",
            "docker://ghcr.io/org/multinode:1.0",
        ),
        (
            "localhost:5000/multinode",
            "localhost:5000#multinode",
            "docker://localhost:5000/multinode",
        ),
        ("multinode:dev", "multinode:dev", "docker://multinode:dev"),
        ("pytorch/pytorch:2.5", "pytorch/pytorch:2.5", "docker://pytorch/pytorch:2.5"),
        (
            "/shared/images/multinode.sqsh",
            "/shared/images/multinode.sqsh",
            "/shared/images/multinode.sqsh",
        ),
        (
            "/shared/images/multinode.sif",
            "/shared/images/multinode.sif",
            "/shared/images/multinode.sif",
        ),
    ],
)
def test_image_references_per_slurm_runtime(image, pyxis, apptainer):
    """pyxis: [USER@][REGISTRY#]IMAGE[:TAG] or a squashfs path (github.com/NVIDIA/pyxis);
    Apptainer: docker://REF or a SIF file (apptainer.org/docs/user/latest/docker_and_oci.html)."""
    assert (pyxis_image(image), apptainer_image(image)) == (pyxis, apptainer)
