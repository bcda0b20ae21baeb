"""Every rank's progress, seen without a change to the trainer.

The site hook calls `install()` in every process the launcher starts. Once the trainer imports
torch, torch's global optimizer-step hook (`register_optimizer_step_post_hook`) counts every
optimizer step of every `torch.optim.Optimizer` (DDP, FSDP, DeepSpeed's optimizers, the Hugging
Face Trainer, accelerate, Lightning all step one), and `torch.autograd.backward` is timed from the
last step: the time before backward is the rank's own work (data loading, forward), the time in
backward includes the wait for the slowest rank's gradients. `torch.save`, torch's distributed
checkpoint, DeepSpeed's `save_checkpoint` and safetensors' `save_file`/`save_model` (the Hugging
Face Trainer's weights) say while they save, so that a long save is not a hang. An evaluation is
not one either: once a model is put in eval mode (`model.eval()`, as the Hugging Face Trainer,
Lightning and most loops do), each forward pass of it or of its direct children counts as
progress (not as a step: the hang clock starts again, the step figures stay the training's). The
hooks go once the model is back in training (the first forward in train mode, or with gradients,
removes them): training pays nothing for them.

A torch loop without a torch optimizer (one that updates its weights by hand) is counted by its
backward passes instead: each `torch.autograd.backward` (`loss.backward()`) that returns is a
step, until the process's first optimizer step, from which the optimizer's steps are the count
again (counted from 1). A JAX trainer is counted by its own compiled calls (jax_steps). A trainer
that has neither can call `step()` (re-exported as `entrypoint.progress.step`) once a step.

Each report is one datagram of a few dozen bytes to the node's entrypoint, on a Unix socket in
the abstract namespace that ENTRYPOINT_PROGRESS_SOCKET names, sent without blocking and at most
every SEND_EVERY seconds: if the entrypoint is gone, slow or its queue is full, the report is
dropped; the trainer never waits. Without ENTRYPOINT_PROGRESS_SOCKET nothing is installed.

On its first step a rank registers faulthandler on DUMP_SIGNAL (a real-time signal no library
uses), writing every thread's Python stack into its own file under ENTRYPOINT_STACKS_DIR: the
entrypoint sends that signal when the job stops stepping, and names the rank that is not where
the others are. Its reports then carry its default process group's timeout too: the entrypoint
names a hang before that timeout fires (torch's error would name no rank).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any

from entrypoint.trainer_side.after_import import when_imported

if TYPE_CHECKING:
    from torch.nn import Module

    from entrypoint.trainer_side.flight import Answerer

SOCKET_VARIABLE = "ENTRYPOINT_PROGRESS_SOCKET"  # "@name": the abstract socket \0name
STACKS_VARIABLE = "ENTRYPOINT_STACKS_DIR"
DUMP_SIGNAL = signal.SIGRTMIN + 6  # 40 on Linux: glibc keeps the first few, nobody uses this one
SEND_EVERY = 0.05  # seconds: at most 20 reports a second from a rank
ACTIVE_EVERY = 1.0  # seconds: at most one report a second from forward passes in evaluation

# One report: version, rank, local rank, pid, steps, the last step's time (CLOCK_MONOTONIC,
# shared by every process of the machine), the time before backward summed over `leads` steps,
# the longest step interval, both since the last report, whether the rank is saving, and the
# time of its last forward pass in evaluation (0: none since its first step), and its default
# process group's collective timeout in seconds (0: unknown).
WIRE = struct.Struct("<BiiiqddIdBdd")
VERSION = 3


class Reporter:
    """This process's progress and its channel to the node's entrypoint."""

    def __init__(
        self, address: str, stacks_dir: str | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.stacks_dir = stacks_dir
        self.clock = clock
        self.sock: socket.socket | None = None
        self.steps = 0
        self.last_step = 0.0
        self.last_sent = -1.0
        self.lead_sum, self.leads = 0.0, 0
        self.longest = 0.0
        self.active_at = 0.0  # the last forward pass in evaluation
        self.saving = 0  # nested saves (DeepSpeed's save calls torch.save)
        self.rank = self.local_rank = -1
        self.stack_file: IO[str] | None = None
        self.flight: Answerer | None = None
        self.group_timeout = 0.0
        self.started = False  # the first step's registrations are done
        self.by_optimizer = False  # steps are the optimizer's (else backward passes or calls)
        self.lock = threading.Lock()  # a save may run in another thread

    def optimizer_step(self) -> None:
        """A torch optimizer's step: from the first one, the only steps counted."""
        if not self.by_optimizer:
            self.by_optimizer = True
            self.steps = 0  # backward passes counted until now give way to optimizer steps
        self.step()

    def backward_done(self) -> None:
        """A backward pass returned: a step while the process has stepped no torch optimizer."""
        if not self.by_optimizer:
            self.step()

    def step(self) -> None:
        """One training step done: counted, and reported if the last report is old enough."""
        now = self.clock()
        if not self.started:
            self.started = True
            self._first_step()
        elif self.steps and now - self.last_step > self.longest:
            self.longest = now - self.last_step
        self.steps += 1
        self.last_step = now
        if now - self.last_sent >= SEND_EVERY:
            self.send(now)

    def active(self) -> None:
        """A forward pass in evaluation: progress, not a step (the hang clock starts again; the
        steps, their intervals and the time before backward stay the training's)."""
        if not self.steps:
            return
        now = self.clock()
        self.active_at = now
        if now - self.last_sent >= ACTIVE_EVERY:
            self.send(now)

    def backward_started(self) -> None:
        if self.steps:
            self.lead_sum += self.clock() - self.last_step
            self.leads += 1

    def save(self, starting: bool) -> None:
        with self.lock:
            self.saving += 1 if starting else -1
            self.saving = max(0, self.saving)
            self.send(self.clock())

    def send(self, now: float) -> None:
        if self.sock is None and not self._connect():
            return
        assert self.sock is not None
        data = WIRE.pack(
            VERSION,
            self.rank,
            self.local_rank,
            os.getpid(),
            self.steps,
            self.last_step,
            self.lead_sum,
            self.leads,
            self.longest,
            1 if self.saving else 0,
            self.active_at,
            self.group_timeout,
        )
        try:
            self.sock.send(data)
        except OSError:  # gone, slow or full: dropped; the next step sends at once
            self.last_sent = -1.0
            return
        self.last_sent = now
        self.lead_sum, self.leads, self.longest = 0.0, 0, 0.0

    def _connect(self) -> bool:
        """A socket connected to the node's (a send then skips the address lookup); none while
        nobody listens there, tried again at the next report."""
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            sock.setblocking(False)
        except OSError:
            return False
        try:
            sock.connect(self.address)
        except OSError:
            sock.close()
            return False
        self.sock = sock
        return True

    def _first_step(self) -> None:
        self.rank = _rank()
        self.local_rank = int(os.environ.get("LOCAL_RANK", "-1") or -1)
        from entrypoint.trainer_side import flight  # json: only once a rank steps

        # the entrypoint's hang timeout stays below it (entrypoint.coordinator.rank_judgement)
        self.group_timeout = flight.group_timeout()
        if self.stacks_dir:
            self._register_dump()
            self.flight = flight.start(self.address, self.stacks_dir, self.rank, self.stack_file)

    def _register_dump(self) -> None:
        """Every thread's stack into this rank's file when DUMP_SIGNAL arrives."""
        assert self.stacks_dir is not None
        try:
            os.makedirs(self.stacks_dir, exist_ok=True)
            path = os.path.join(self.stacks_dir, f"rank{self.rank}.pid{os.getpid()}.txt")
            self.stack_file = open(path, "w", buffering=1)  # noqa: SIM115 - kept for the handler
            self.stack_file.write(f"main thread 0x{threading.main_thread().ident:016x}\n")
            faulthandler.register(DUMP_SIGNAL, file=self.stack_file, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            self.stack_file = None


def _rank() -> int:
    for name in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "JAX_PROCESS_ID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    distributed: Any = sys.modules.get("torch.distributed")
    try:
        if distributed is not None and distributed.is_initialized():
            return int(distributed.get_rank())
    except Exception:  # noqa: BLE001 - a rank we cannot tell is -1, never an error
        pass
    return -1


_reporter: Reporter | None = None


def step() -> None:
    """Say one training step is done (for trainers without a torch optimizer, JAX's included).
    Costs about a microsecond; does nothing outside `entrypoint run`."""
    if _reporter is not None:
        _reporter.step()


def _on_optimizer_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
    if _reporter is not None:
        _reporter.optimizer_step()


def _jax_step(own: float) -> None:
    """A JAX process's step, with its own work since its last one (jax_steps; -1: unknown)."""
    reporter = _reporter
    if reporter is None:
        return
    if own >= 0 and reporter.steps:
        reporter.lead_sum += own
        reporter.leads += 1
    reporter.step()


def _on_jax(jax: ModuleType) -> None:
    from entrypoint.trainer_side import jax_steps

    try:
        jax_steps.on_jax(jax, _jax_step)
    except Exception as err:  # noqa: BLE001 - never stop the trainer
        print(f"entrypoint: progress hook: {type(err).__name__}: {err}", file=sys.stderr)


def _saving(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, saying to the entrypoint while it runs that this rank is saving."""
    if getattr(function, "_entrypoint_saving", False):
        return function

    def saving(*args: Any, **kwargs: Any) -> Any:
        reporter = _reporter
        if reporter is None:
            return function(*args, **kwargs)
        reporter.save(True)
        try:
            return function(*args, **kwargs)
        finally:
            reporter.save(False)

    saving._entrypoint_saving = True  # type: ignore[attr-defined]
    saving.__wrapped__ = function  # type: ignore[attr-defined]
    saving.__name__ = getattr(function, "__name__", "saving")
    saving.__doc__ = getattr(function, "__doc__", None)
    return saving


def _timed_backward(function: Callable[..., Any]) -> Callable[..., Any]:
    if getattr(function, "_entrypoint_backward", False):
        return function

    def backward(*args: Any, **kwargs: Any) -> Any:
        reporter = _reporter
        if reporter is not None:
            reporter.backward_started()
        out = function(*args, **kwargs)
        if reporter is not None:
            reporter.backward_done()
        return out

    backward._entrypoint_backward = True  # type: ignore[attr-defined]
    backward.__wrapped__ = function  # type: ignore[attr-defined]
    backward.__doc__ = getattr(function, "__doc__", None)
    return backward


def _on_torch(torch: ModuleType) -> None:
    try:
        optimizer = sys.modules["torch.optim.optimizer"]  # torch.optim deletes the name
        optimizer.register_optimizer_step_post_hook(_on_optimizer_step)
        torch.autograd.backward = _timed_backward(torch.autograd.backward)
        torch.save = _saving(torch.save)  # type: ignore[attr-defined]
        torch.nn.Module.train = _watching_eval(torch.nn.Module.train)
    except Exception as err:  # noqa: BLE001 - never stop the trainer
        print(f"entrypoint: progress hook: {type(err).__name__}: {err}", file=sys.stderr)


# The modules whose forward passes are watched while in eval mode, and their hooks' handles.
_watched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_switching = threading.local()  # inside a module's train(mode): its children's calls pass


def _watching_eval(function: Callable[..., Any]) -> Callable[..., Any]:
    """`Module.train`, which after `train(False)` (`eval()`: DeepSpeed's engine calls its
    module's `train(False)` itself) watches the module's forward passes and its direct
    children's (a Lightning `validation_step` calls a child: `self.encoder(x)`), until the
    module trains again. The children's own calls, inside their parent's, pass straight on."""
    if getattr(function, "_entrypoint_eval", False):
        return function

    def train(self: Module, mode: bool = True) -> Any:
        if getattr(_switching, "on", False):
            return function(self, mode)
        _switching.on = True
        try:
            out = function(self, mode)
        finally:
            _switching.on = False
        if not mode and _reporter is not None:
            try:
                for module in (self, *self.children()):
                    if module not in _watched:
                        _watched[module] = module.register_forward_hook(_eval_forward)
            except Exception:  # noqa: BLE001, S110 - never stop the trainer
                pass
        return out

    train._entrypoint_eval = True  # type: ignore[attr-defined]
    train.__wrapped__ = function  # type: ignore[attr-defined]
    train.__doc__ = getattr(function, "__doc__", None)
    return train


def _eval_forward(module: Module, _args: Any, _output: Any) -> None:
    grad: Any = sys.modules.get("torch")
    # Training again, or a module kept in eval mode inside training (a frozen BatchNorm): the
    # hook goes, training pays nothing for it. An evaluation runs without gradients.
    if module.training or (grad is not None and grad.is_grad_enabled()):
        handle = _watched.pop(module, None)
        if handle is not None:
            handle.remove()
        return
    if _reporter is not None:
        _reporter.active()


def _on_safetensors(module: ModuleType) -> None:
    for name in ("save_file", "save_model"):
        if hasattr(module, name):
            setattr(module, name, _saving(getattr(module, name)))


def _on_checkpoint(module: ModuleType) -> None:
    for name in ("save", "async_save", "save_state_dict"):
        if hasattr(module, name):
            setattr(module, name, _saving(getattr(module, name)))


def _on_deepspeed_engine(module: ModuleType) -> None:
    engine = getattr(module, "DeepSpeedEngine", None)
    if engine is not None and hasattr(engine, "save_checkpoint"):
        engine.save_checkpoint = _saving(engine.save_checkpoint)


def install(env: os._Environ | dict[str, str] = os.environ) -> None:
    """Report this process's steps to the node's entrypoint, when it listens (the site hook)."""
    global _reporter
    address = env.get(SOCKET_VARIABLE)
    if not address or _reporter is not None:
        return
    _reporter = Reporter(address, env.get(STACKS_VARIABLE))
    when_imported("torch", _on_torch)
    when_imported("jax", _on_jax)
    when_imported("torch.distributed.checkpoint", _on_checkpoint)
    when_imported("deepspeed.runtime.engine", _on_deepspeed_engine)
    when_imported("safetensors.torch", _on_safetensors)
