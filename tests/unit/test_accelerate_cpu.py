"""entrypoint/accelerate_cpu.py: gloo where accelerate 1.15 finds no backend for DeepSpeed on the
CPU, nothing anywhere else. The real runs are tests/compat (accelerate's quick tour and the
Hugging Face Trainer with --deepspeed on CPU node containers); here a stand-in
`accelerate/state.py` on a temporary path goes through the real import machinery."""

import sys
import textwrap

import pytest

from entrypoint import accelerate_cpu

DEEPSPEED_ON_CPU = {"DS_ACCELERATOR": "cpu", "LOCAL_RANK": "0", "ACCELERATE_USE_DEEPSPEED": "true"}


@pytest.mark.parametrize(("found", "env", "expected"), [
    (None, DEEPSPEED_ON_CPU, "gloo"),
    ("nccl", DEEPSPEED_ON_CPU, "nccl"),  # accelerate's own choice always stands
    (None, DEEPSPEED_ON_CPU | {"ACCELERATE_USE_DEEPSPEED": "false"}, None),  # no DeepSpeed
    (None, {k: v for k, v in DEEPSPEED_ON_CPU.items() if k != "LOCAL_RANK"}, None),  # no launcher
    (None, DEEPSPEED_ON_CPU | {"DS_ACCELERATOR": "cuda"}, None),
    (None, {}, None),
])
def test_backend_for(found, env, expected):
    assert accelerate_cpu.backend_for(found, env) == expected


@pytest.fixture
def stand_in_accelerate(tmp_path, monkeypatch):
    package = tmp_path / "accelerate"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "state.py").write_text(textwrap.dedent("""\
        class PartialState:
            def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
                return backend, "NO"
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("accelerate", "accelerate.state"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    return package


def test_patched_when_first_imported_on_a_cpu_node(stand_in_accelerate, monkeypatch):
    for key, value in DEEPSPEED_ON_CPU.items():
        monkeypatch.setenv(key, value)
    accelerate_cpu.install()
    accelerate_cpu.install()  # twice: one hook, one wrapper
    import accelerate.state

    state = accelerate.state.PartialState()
    assert state._prepare_backend() == ("gloo", "NO")
    assert state._prepare_backend(backend="ccl") == ("ccl", "NO")
    assert not any(isinstance(f, accelerate_cpu._AfterImport) for f in sys.meta_path)


def test_nothing_on_a_gpu_node(stand_in_accelerate):
    accelerate_cpu.install({"DS_ACCELERATOR": "cuda"})
    import accelerate.state

    assert accelerate.state.PartialState()._prepare_backend() == (None, "NO")
