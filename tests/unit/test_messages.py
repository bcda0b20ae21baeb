"""The control channel's messages (entrypoint/control/messages.py): every kind round-trips through
the wire, and what the schema refuses, with the reason it gives. The job identity each platform
gives its nodes (entrypoint/control/identity.py), and the token's rules."""

from __future__ import annotations

import json
import signal

import pytest

from entrypoint.control import message_fields
from entrypoint.control import messages as m
from entrypoint.control.identity import job_identity, read_token
from entrypoint.control.node_fingerprint import Fingerprint
from entrypoint.control.node_stats import GpuFigures, NodeStats
from entrypoint.control.rank_records import Failure
from entrypoint.plan.errors import ConfigError

FP = {
    "image_lock": "abc",
    "image_revision": "r1",
    "python": "3.13.5",
    "torch": "2.10.0",
    "jax": "0.12.0.1",
    "deepspeed": "0.19.8",
    "nccl": "2.27.5",
    "cuda_driver": "12",
    "gpu_model": "NVIDIA H100",
    "gpus_per_node": 8,
    "packages": {"torch": "2.10.0"},
    "data": {"path": "/data", "exists": True, "files": 3, "bytes": 10, "partial": False},
    "layout": {
        "nnodes": 2,
        "node_rank": 1,
        "spares": 0,
        "min_nodes": 2,
        "nproc_per_node": 8,
        "world_size": 16,
        "master_addr": "node-0",
        "master_port": 29500,
        "launcher": "torchrun",
    },
}

EVERY_KIND = [
    m.Hello(
        1,
        "node-1",
        Fingerprint.from_wire(FP),
        1000.5,
        node_rank=1,
        generation=2,
        job="SLURM_JOB_ID=7",
        auth=m.AUTH_HMAC,
        nonce="a" * 32,
        proof="b" * 64,
    ),
    m.Hello(
        2, "node-2", Fingerprint.from_wire(FP), 1000.5, nonce="e" * 32, holds="2 node-2 node-2:1"
    ),
    m.Elsewhere("1 fd00::2 [fd00::2]:29501"),
    m.Beat(NodeStats((GpuFigures(90.0, 1, 2),))),
    m.Beat(NodeStats(load=1.5)),
    m.Beat(),
    m.Exit(143, signal=15),
    m.Exit(
        1,
        failure=Failure(3, 1, -9, ("boom",), 1.5, "", False),
        reason="rank 3 failed",
    ),
    m.Signal(10),
    m.Signal(15, "node 1 received SIGTERM"),
    m.Challenge("c" * 32, "", m.AUTH_NONE),
    m.Welcome(""),
    m.Welcome("d" * 64),
    m.Refuse("wrong job token"),
    m.Go(1, ("clock +3 s",)),
    m.Go(0, (), 1, 2, ("0=worker-0", "1=fd00::2", "2=worker-2.cluster.local")),
    m.Stop(75, "lost node 1"),
    m.Restart(1, "rank 3 failed"),
    m.Done(),
]


@pytest.mark.parametrize("message", EVERY_KIND, ids=lambda x: x.kind)
def test_every_kind_round_trips(message):
    allowed = m.FROM_NODES | m.FROM_NODE_0
    assert m.decode(m.encode(message).rstrip(b"\n"), allowed) == message


@pytest.mark.parametrize(
    "wire, why",
    [
        ({"t": "exit", "code": 256}, "code must be an integer 0-255, got 256"),
        ({"t": "exit", "code": -1}, "code must be an integer 0-255"),
        ({"t": "exit", "code": 1.0}, "code must be an integer"),
        ({"t": "exit", "code": True}, "code must be an integer"),
        ({"t": "exit", "code": 0, "signal": 0}, "signal must be an integer 1-127"),
        ({"t": "exit", "code": 0, "signal": 128}, "signal must be an integer 1-127"),
        ({"t": "exit", "code": 1, "failure": "x"}, "failure must be an object"),
        ({"t": "exit", "code": 1, "failure": {"tail": [1]}}, "tail must be a list"),
        ({"t": "signal"}, "signal missing"),
        ({"t": "signal", "signal": "15"}, "signal must be an integer"),
        ({"t": "beat", "stats": {"gpus": [{"util": "x"}]}}, "util must be a finite number"),
        ({"t": "beat", "stats": {"gpus": "x"}}, "stats.gpus must be a list"),
        ({"t": "beat", "stats": {"load": -1e400}}, "-Infinity is not a number JSON allows"),
        ({"t": "beat", "stats": {"load": "high"}}, "load must be a finite number"),
        ({"t": "beat", "stats": [1]}, "stats must be an object"),
        ({"t": "hello", "protocol": 2, "member": -1, "host": "h"}, "member must be an integer"),
        ({"t": "hello", "protocol": 2, "member": 1, "host": "h" * 300}, "host must be a string"),
        ({"t": "stop", "code": 2, "reason": "x"}, "unknown message type 'stop'"),
        ({"t": 1}, "unknown message type 1"),
        ({}, "unknown message type None"),
    ],
)
def test_what_the_schema_refuses(wire, why):
    with pytest.raises(m.BadMessage, match=why.replace("(", r"\(").replace(")", r"\)")):
        m.decode(json.dumps(wire).encode())


@pytest.mark.parametrize(
    "etcd, why",
    [
        (["worker-0"], "etcd must list MEMBER=HOST"),
        (["0=a b"], "etcd must list MEMBER=HOST"),
        (["0=a,b"], "etcd must list MEMBER=HOST"),
        ([f"{i}=h" for i in range(6)], "etcd must be a list of at most 5 strings"),
    ],
)
def test_a_go_names_the_jobs_etcd_members_only_as_member_and_host(etcd, why):
    with pytest.raises(m.BadMessage, match=why):
        m.decode(json.dumps({"t": "go", "etcd": etcd}).encode(), m.FROM_NODE_0)


@pytest.mark.parametrize(
    "holds", ["node-2", "2 node-2", "x node-2 node-2:1", "2 node 2 h:1", "2 h " + "p" * 301]
)
def test_a_knock_names_node_0s_seat_only_as_member_host_and_address(holds):
    hello = m.Hello(2, "h", Fingerprint.from_wire(FP), 1.0, nonce="e" * 32, holds=holds).to_wire()
    with pytest.raises(m.BadMessage, match="holds must be"):
        m.decode(json.dumps(hello).encode())
    with pytest.raises(m.BadMessage, match="holds must be"):
        m.decode(json.dumps({"t": "elsewhere", "holds": holds}).encode(), m.FROM_NODE_0)
    with pytest.raises(m.BadMessage, match="holds missing"):
        m.decode(json.dumps({"t": "elsewhere"}).encode(), m.FROM_NODE_0)
    assert "holds" not in m.Hello(2, "h", Fingerprint(), 1.0).to_wire()  # a join's hello


def test_another_protocol_version_is_read_only_as_far_as_its_number():
    """So that node 0 can say which version a node speaks, whatever else a version sends."""
    hello = m.decode(b'{"t":"hello","protocol":1,"member":1,"host":"old","fingerprint":3}')
    assert (hello.protocol, hello.member, hello.host) == (1, 1, "old")


def test_known_signals_are_this_systems():
    assert {signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL} <= message_fields.KNOWN_SIGNALS
    assert 0 not in message_fields.KNOWN_SIGNALS


def test_proofs_bind_both_nonces_the_job_and_the_member():
    token = b"t" * 32
    base = m.hello_proof(token, "a" * 32, "b" * 32, "job", 1)
    assert len(base) == 64 and m.same(base, m.hello_proof(token, "a" * 32, "b" * 32, "job", 1))
    others = [
        m.hello_proof(b"u" * 32, "a" * 32, "b" * 32, "job", 1),
        m.hello_proof(token, "c" * 32, "b" * 32, "job", 1),
        m.hello_proof(token, "a" * 32, "c" * 32, "job", 1),
        m.hello_proof(token, "a" * 32, "b" * 32, "other", 1),
        m.hello_proof(token, "a" * 32, "b" * 32, "job", 2),
        m.welcome_proof(token, "a" * 32, "b" * 32, "job", 1),
    ]
    assert base not in others and len(set(others)) == len(others)


# Where each platform documents the variable that names the job:
# SLURM: https://slurm.schedmd.com/sbatch.html#OPT_SLURM_JOB_ID, SLURM_RESTART_COUNT
# Open MPI 5 (PRRTE/PMIx): PMIX_NAMESPACE; Open MPI 4: OMPI_MCA_ess_base_jobid
# AWS Batch multi-node: https://docs.aws.amazon.com/batch/latest/userguide/job_env_vars.html
# SageMaker: TRAINING_JOB_NAME (sagemaker-training-toolkit's environment)
# SkyPilot: https://docs.skypilot.co/en/latest/running-jobs/environment-variables.html
# JobSet: JOBSET_NAME, mapped in by the pod template (see entrypoint/plan/platforms/jobset.py)
@pytest.mark.parametrize(
    "platform, env, job_id, expected",
    [
        ("slurm", {"SLURM_JOB_ID": "4242"}, None, "SLURM_JOB_ID=4242"),
        (
            "slurm",
            {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1"},
            None,
            "SLURM_JOB_ID=4242 (restart 1)",
        ),
        (
            "mpi",
            {"PMIX_NAMESPACE": "prterun-a-1@1", "SLURM_JOB_ID": "9"},
            None,
            "PMIX_NAMESPACE=prterun-a-1@1",
        ),
        ("mpi", {"OMPI_MCA_ess_base_jobid": "123456"}, None, "OMPI_MCA_ess_base_jobid=123456"),
        ("awsbatch", {"AWS_BATCH_JOB_ID": "a1b2#3"}, None, "AWS_BATCH_JOB_ID=a1b2"),
        ("sagemaker", {"TRAINING_JOB_NAME": "train-1"}, None, "TRAINING_JOB_NAME=train-1"),
        ("skypilot", {"SKYPILOT_TASK_ID": "sky-1_c_2"}, None, "SKYPILOT_TASK_ID=sky-1_c_2"),
        ("jobset", {"JOBSET_NAME": "js"}, None, "JOBSET_NAME=js"),
        ("torchrun", {"SLURM_JOB_ID": "4242"}, None, ""),  # started by hand: not SLURM's job
        ("indexedjob", {}, None, ""),
        ("indexedjob", {}, "train-7f3a", "ENTRYPOINT_JOB_ID=train-7f3a"),
        ("slurm", {"SLURM_JOB_ID": "4242"}, "mine", "ENTRYPOINT_JOB_ID=mine"),
    ],
)
def test_job_identity_per_platform(platform, env, job_id, expected):
    assert job_identity(env, platform, job_id) == expected


def test_a_token_of_low_variety_is_refused_naming_the_variable_masked(tmp_path):
    """Issue 28: 16 of one letter, two letters in turn: refused in one line, value masked, the
    fix given; a random hex token of 16 characters passes."""
    fix = "Use a random one, e.g. `od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`"
    with pytest.raises(ConfigError) as one:
        read_token("a" * 16, None)
    assert one.value.line() == (
        "ENTRYPOINT_JOB_TOKEN='***': the token has 1 distinct characters, fewer than 4: it "
        f"is not random (a guess finds it). {fix}"
    )
    (tmp_path / "token").write_text("ab" * 20 + "\n")
    with pytest.raises(ConfigError) as two:
        read_token(None, tmp_path / "token")
    assert two.value.line().startswith(
        f"ENTRYPOINT_JOB_TOKEN_FILE='{tmp_path / 'token'}': the token has 2 distinct characters, "
        "fewer than 8"
    )
    assert "abab" not in two.value.line()
    assert read_token("3f9a0c17be52d6e4", None) == b"3f9a0c17be52d6e4"


def test_the_token_from_the_variable_or_a_file(tmp_path):
    assert read_token(None, None) is None
    assert read_token(" 0123456789abcdef\n", None) == b"0123456789abcdef"
    (tmp_path / "token").write_text("fedcba9876543210fedcba\n")
    assert read_token(None, tmp_path / "token") == b"fedcba9876543210fedcba"
    with pytest.raises(ConfigError) as short:
        read_token("secret", None)
    assert short.value.line() == (
        "ENTRYPOINT_JOB_TOKEN='***': the token is shorter than 16 "
        "characters. Use a random one, e.g. `od -An -tx1 -N32 /dev/urandom | tr -d ' \\n'`"
    )
    with pytest.raises(ConfigError, match="ENTRYPOINT_JOB_TOKEN_FILE=.*cannot be read"):
        read_token(None, tmp_path / "missing")
    with pytest.raises(ConfigError, match="ENTRYPOINT_JOB_TOKEN is set too"):
        read_token("0123456789abcdef", tmp_path / "token")
