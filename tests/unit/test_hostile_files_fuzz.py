"""Hypothesis over a config directory's files (issue 15): any bytes written as deepspeed.json or
config.json give a plan whose batch split holds, or one ConfigError line; never another
exception, never more than a second of CPU. The shapes found by hand are in
test_hostile_files.py."""

import json
import os
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import node
from entrypoint.plan.errors import ConfigError
from entrypoint.plan.node_plan import make_plan

BATCH_FIELDS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
NUMBERS = st.one_of(
    st.integers(min_value=-3, max_value=300),
    st.sampled_from([0, 10**9, 10**9 + 1, 10**15, 10**15 + 1, 10**30, 10**401, -(10**20)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["auto", "8", None, True, [], {}]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=8))
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)
DEEPSPEED = st.fixed_dictionaries(
    {}, optional={field: NUMBERS for field in BATCH_FIELDS} | {"zero_optimization": JSON}
)


def _nested(depth: int, opener: str) -> str:
    closer = "]" if opener == "[" else "}"
    inner = '{"a": ' if opener == "{" else "["
    return '{"x": ' + inner * depth + "1" * (opener == "[") + closer * depth + "}"


TEXTS = st.one_of(
    DEEPSPEED.map(json.dumps),  # allow_nan: NaN and Infinity as Python writes them
    JSON.map(json.dumps),
    st.builds(_nested, st.integers(min_value=60, max_value=5_000), st.sampled_from("[{")),
)
FILES = st.one_of(st.binary(max_size=300), TEXTS.map(str.encode))
META = st.one_of(
    st.none(),
    FILES,
    st.fixed_dictionaries(
        {},
        optional={
            "device": st.sampled_from(["cuda", "cpu", "tpu", 1]),
            "world_size": NUMBERS,
            "accelerate": JSON,
        },
    ).map(lambda d: json.dumps(d).encode()),
)
BOUNDED = settings(
    max_examples=int(os.environ.get("HOSTILE_EXAMPLES", "150")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _plan_or_one_line(directory: Path, gpus: int, nnodes: int) -> None:
    env = {
        "NNODES": str(nnodes),
        "NODE_RANK": "0",
        "MASTER_ADDR": "10.0.0.1",
        "ENTRYPOINT_GPUS_PER_NODE": str(gpus),
        "ENTRYPOINT_CONFIG": str(directory),
    }
    start = time.process_time()
    try:
        plan = make_plan(env, node(gpus))
    except ConfigError as err:
        line = err.line()
        assert "\n" not in line and len(line) < 1000, line[:1000]
        assert line.startswith("ENTRYPOINT_CONFIG=")
    else:
        ds = json.loads(plan.files["/tmp/entrypoint-run/node0/deepspeed.json"])
        total, micro = ds.get("train_batch_size"), ds.get("train_micro_batch_size_per_gpu")
        if isinstance(total, int) and isinstance(micro, int):
            assert micro * ds["gradient_accumulation_steps"] * plan.world_size == total
    assert time.process_time() - start < 1.0


@BOUNDED
@given(deepspeed=FILES, meta=META, gpus=st.integers(1, 16), nnodes=st.integers(1, 64))
def test_any_config_directory_plans_or_is_refused_in_one_line(deepspeed, meta, gpus, nnodes):
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        (directory / "deepspeed.json").write_bytes(deepspeed)
        if meta is not None:
            (directory / "config.json").write_bytes(meta)
        _plan_or_one_line(directory, gpus, nnodes)
