"""The rendered specs the tests share: one golden case per platform and SLURM runtime.

Each case is the `entrypoint render` command line after `render`; tests/golden/render/<case>
holds its output (`make golden` rewrites them).
"""

from pathlib import Path

from entrypoint.render import render
from entrypoint.render.request import build

GOLDEN_DIR = Path(__file__).parents[1] / "golden" / "render"
IMAGE = "ghcr.io/example/multinode:1.0"
TRAIN = ["--", "python", "train.py", "--epochs", "3"]

# case file name: (platform, options as build() takes them)
GOLDEN: dict[str, tuple[str, dict]] = {
    "slurm-pyxis.sbatch": (
        "slurm",
        {
            "nodes": "2",
            "gpus_per_node": "8",
            "image": IMAGE,
            "runtime": "pyxis",
            "partition": "gpu",
            "time": "04:00:00",
            "env": ["NCCL_DEBUG=INFO", "HF_TOKEN"],
            "trainer": TRAIN,
        },
    ),
    "slurm-apptainer.sbatch": (
        "slurm",
        {
            "nodes": "2",
            "gpus_per_node": "8",
            "image": IMAGE,
            "runtime": "apptainer",
            "account": "ml",
            "master_port": "29400",
            "trainer": TRAIN,
        },
    ),
    # The flavour the SLURM-in-containers test submits: CPU nodes, the built-in job.
    "slurm-none.sbatch": (
        "slurm",
        {"nodes": "2", "gpus_per_node": "0", "image": IMAGE, "runtime": "none", "time": "00:10:00"},
    ),
    "kubernetes.yaml": (
        "kubernetes",
        {
            "nodes": "2",
            "gpus_per_node": "8",
            "image": IMAGE,
            "namespace": "ml",
            "env": ["NCCL_DEBUG=INFO", "HF_TOKEN"],
            "trainer": TRAIN,
        },
    ),
    "pytorchjob.yaml": (
        "pytorchjob",
        {"nodes": "2", "gpus_per_node": "8", "image": IMAGE, "env": ["HF_TOKEN"], "trainer": TRAIN},
    ),
    "trainjob.yaml": (
        "trainjob",
        {"nodes": "2", "gpus_per_node": "8", "image": IMAGE, "env": ["HF_TOKEN"], "trainer": TRAIN},
    ),
    "volcano.yaml": (
        "volcano",
        {"nodes": "2", "gpus_per_node": "8", "image": IMAGE, "env": ["HF_TOKEN"], "trainer": TRAIN},
    ),
    "docker.sh": (
        "docker",
        {
            "nodes": "2",
            "gpus_per_node": "8",
            "image": IMAGE,
            "master_addr": "10.0.0.1",
            "env": ["NCCL_DEBUG=INFO", "HF_TOKEN"],
            "trainer": TRAIN,
        },
    ),
}
# The same with one spare and a minimum: what each platform does when a node dies.
SPARES = {"spares": "1", "min_nodes": "1"}
GOLDEN |= {
    f"{name}-spares.{suffix}": (platform, options | SPARES)
    for name, suffix in (
        ("kubernetes", "yaml"),
        ("pytorchjob", "yaml"),
        ("trainjob", "yaml"),
        ("volcano", "yaml"),
        ("slurm-pyxis", "sbatch"),
        ("docker", "sh"),
    )
    for platform, options in [GOLDEN[f"{name}.{suffix}"]]
}


def rendered(case: str) -> str:
    platform, options = GOLDEN[case]
    return render(build(platform, **options))
