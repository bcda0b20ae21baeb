"""SLURM hostlist expansion. Expected values follow `scontrol show hostnames`
(https://slurm.schedmd.com/scontrol.html#OPT_hostnames; src/common/hostlist.c)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.hostlist import HostlistError, expand, expand_var

CASES = [
    ("node1", ["node1"]),
    ("a,b,c", ["a", "b", "c"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("node[01-03]", ["node01", "node02", "node03"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("node[08-11]", ["node08", "node09", "node10", "node11"]),
    ("node[001-002,010]", ["node001", "node002", "node010"]),
    ("gpu[1,3,5]", ["gpu1", "gpu3", "gpu5"]),
    ("node[1-2],gpu[3-4]", ["node1", "node2", "gpu3", "gpu4"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    (
        "jo-dbxfe2k2l635222i-worker-[0-1]",
        ["jo-dbxfe2k2l635222i-worker-0", "jo-dbxfe2k2l635222i-worker-1"],
    ),
    ("n[1-2].cluster.local", ["n1.cluster.local", "n2.cluster.local"]),
    ("x[9]", ["x9"]),
]


@pytest.mark.parametrize(("hostlist", "hosts"), CASES)
def test_expand(hostlist, hosts):
    assert expand(hostlist) == hosts


BAD = [
    "",
    "node[1-",
    "node]1",
    "node[a-b]",
    "node[3-1]",
    "node[[1]]",
    "a,,b",
    ",a",
    "node[]",
    "node[1-2",
    "no de",
    "node[1--2]",
    "node[-1]",
]


@pytest.mark.parametrize("hostlist", BAD)
def test_refuses_malformed(hostlist):
    with pytest.raises(HostlistError):
        expand(hostlist)


def test_error_names_the_variable():
    with pytest.raises(ConfigError) as err:
        expand_var("SLURM_JOB_NODELIST", "node[1-")
    assert err.value.line().startswith("SLURM_JOB_NODELIST='node[1-': not a valid SLURM hostlist")


# Property: compress a random set of hosts the way SLURM writes them, expand it back.
prefixes = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=6).filter(
    lambda p: not p[-1].isdigit()
)


@st.composite
def groups(draw):
    prefix = draw(prefixes)
    width = draw(st.integers(min_value=1, max_value=4))
    numbers = sorted(
        draw(st.sets(st.integers(min_value=0, max_value=10**width - 1), min_size=1, max_size=12))
    )
    return prefix, width, numbers


def compress(prefix, width, numbers):
    parts, start = [], numbers[0]
    for prev, cur in zip(numbers, numbers[1:] + [None]):
        if cur != (prev + 1 if prev is not None else None):
            parts.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            start = cur
    return f"{prefix}[{','.join(parts)}]"


@settings(max_examples=300)
@given(st.lists(groups(), min_size=1, max_size=4, unique_by=lambda g: g[:2]))
def test_roundtrip(groups_):
    text = ",".join(compress(*g) for g in groups_)
    expected = [f"{p}{n:0{w}d}" for p, w, nums in groups_ for n in nums]
    assert expand(text) == expected


@settings(max_examples=500)
@given(st.text(alphabet="ab01-,[]. x", max_size=20))
def test_never_crashes(text):
    try:
        hosts = expand(text)
    except HostlistError:
        return
    assert hosts and all(hosts)
