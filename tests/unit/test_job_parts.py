"""The built-in job's pure parts: the synthetic task, the per-rank shards, the settings."""

import subprocess
import sys

import numpy as np
import pytest

from entrypoint.job import harness
from entrypoint.job.data import VOCAB, batches, make_task, shard_indices


def test_task_is_deterministic_and_learnable():
    a, b = make_task(0), make_task(0)
    assert np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.tokens, make_task(1).tokens)
    assert a.tokens.min() >= 0 and a.tokens.max() < VOCAB
    assert 0.3 < a.floor < np.log(VOCAB) - 2  # far below guessing: the loss has room to fall


@pytest.mark.parametrize("n, world_size", [(4096, 1), (4096, 2), (4096, 4), (10, 3)])
def test_shards_cover_the_data_without_overlap(n, world_size):
    shards = [shard_indices(n, r, world_size, epoch=0, seed=0) for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1  # every rank the same number of samples
    together = np.concatenate(shards)
    assert set(together) == set(range(n))
    assert len(together) - n < world_size  # padded only up to a multiple of world_size


def test_shards_of_a_global_batch_are_the_same_rows_for_any_world_size():
    """1 worker with batch 16 sees the rows that 2 workers with batch 8 see together."""
    one = next(batches(4096, 0, 1, 16, seed=0))
    two = np.concatenate([next(batches(4096, r, 2, 8, seed=0)) for r in range(2)])
    assert sorted(one) == sorted(two)


def test_a_resumed_stream_continues_where_it_stopped():
    stream = batches(100, 1, 2, 4, seed=3)
    straight = [next(stream) for _ in range(30)]  # crosses epoch boundaries (12 per epoch)
    resumed = batches(100, 1, 2, 4, seed=3, start=17)
    assert all(np.array_equal(next(resumed), want) for want in straight[17:])


def test_settings_from_command_line_beat_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ENTRYPOINT_JOB_STEPS", "7")
    monkeypatch.setenv("ENTRYPOINT_JOB_OUTPUT", str(tmp_path))
    args = harness.parse_args([], "job", "")
    assert (args.steps, args.output, args.checkpoints) == (7, tmp_path, tmp_path / "checkpoints")
    assert harness.parse_args(["--steps", "3"], "job", "").steps == 3


def test_defaults(monkeypatch):
    for name in ("STEPS", "OUTPUT", "SAVE_EVERY", "LOG_EVERY", "SEED", "RESUME"):
        monkeypatch.delenv(f"ENTRYPOINT_JOB_{name}", raising=False)
    args = harness.parse_args([], "job", "")
    assert (args.steps, str(args.output), args.resume) == (100, harness.DEFAULT_OUTPUT, "auto")


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--resume", "maybe"], ["--steps", "x"]])
def test_bad_settings_are_refused(argv):
    with pytest.raises(SystemExit) as exit_info:
        harness.parse_args(argv, "job", "")
    assert exit_info.value.code == 2


def test_package_import_stays_light():
    """The entrypoint looks these modules up on its launch path: no torch, jax or deepspeed."""
    code = (
        "import sys, importlib.util, entrypoint.job;"
        "importlib.util.find_spec('entrypoint.job.jax_train');"
        "importlib.util.find_spec('entrypoint.job.__main__');"
        "heavy = {'torch', 'jax', 'deepspeed', 'numpy'} & set(sys.modules);"
        "print(sorted(heavy)); sys.exit(1 if heavy else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _checkpoint(tmp_path, world, shards):
    from entrypoint.job.deepspeed_train import META_FILE, MODEL_FILE

    folder = tmp_path / "step40"
    folder.mkdir()
    (tmp_path / "latest").write_text("step40")
    (folder / META_FILE).write_text(f'{{"step": 40, "world_size": {world}}}')
    (folder / MODEL_FILE).write_bytes(b"weights")
    for rank in range(shards):
        (folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    return tmp_path


def test_a_checkpoint_of_the_same_world_size_resumes_whole(tmp_path):
    from entrypoint.job.deepspeed_train import WEIGHTS_ONLY, find_checkpoint

    step, tag, why = find_checkpoint(_checkpoint(tmp_path, 4, 4), 4)
    assert (step, tag) == (40, "step40") and not why.startswith(WEIGHTS_ONLY)


@pytest.mark.parametrize("now", [2, 6])  # shrunk, grown back
def test_a_checkpoint_of_another_world_size_resumes_its_weights_and_step(tmp_path, now):
    from entrypoint.job.deepspeed_train import WEIGHTS_ONLY, find_checkpoint

    step, tag, why = find_checkpoint(_checkpoint(tmp_path, 4, 4), now)
    assert (step, tag) == (40, "step40") and why.startswith(WEIGHTS_ONLY)
    assert f"written by 4 workers, this job has {now}" in why


def test_a_checkpoint_missing_shards_here_is_not_resumed(tmp_path):
    from entrypoint.job.deepspeed_train import find_checkpoint

    step, _, why = find_checkpoint(_checkpoint(tmp_path, 4, 2), 4)
    assert step == -1 and "2 of 4 shards" in why


@pytest.mark.parametrize("batch, resumed", [(16, False), (18, True)])
def test_the_jax_job_resumes_a_checkpoint_of_another_global_batch_saying_so(
    tmp_path, batch, resumed
):
    from entrypoint.job.jax_train import find_checkpoint

    (tmp_path / "step20.npz").write_bytes(b"")
    (tmp_path / "latest").write_text('{"step": 20, "file": "step20.npz", "global_batch": 16}')
    step, path, why = find_checkpoint(tmp_path, batch)
    assert (step, path) == (20, tmp_path / "step20.npz")
    assert ("trained with global batch 16, this start has 18" in why) == resumed
