"""What the site hook's progress reporting costs a rank (trainer_side/step_hook.py): the bar is at
most 10 µs a step and no allocation growth.

In one process, with a real node inbox (supervise/rank_inbox.Inbox) listening on its abstract
socket and reading on its own thread, as under `entrypoint run`:
- the hook alone: `_on_optimizer_step` called N times in a loop (every call counts the step,
  one in SEND_EVERY seconds' worth also packs and sends a datagram); and the same with every
  call sending (the worst case: steps slower than SEND_EVERY);
- a real torch optimizer step (SGD on a 10x10 model) with the hook registered and without it,
  the difference per step;
- a loss.backward() of a loop with no torch optimizer, bare and counted as its step;
- a compiled call of a JAX trainer (jax.jit's, where JAX is installed), bare and counted as its
  step (trainer_side/jax_steps.py);
- allocations: tracemalloc's traced memory before and after 200,000 hooked steps;
- `model.train()` on a model of 1,000 modules (the Hugging Face Trainer calls it every step),
  bare and with the site hook's `Module.train` (which watches evaluations), and a training
  forward pass after an evaluation (the watch's hooks removed) against one never evaluated.
Prints figures; asserts nothing.

    python benchmarks/progress_hook.py [--steps 200000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entrypoint.supervise.rank_inbox import Inbox  # noqa: E402
from entrypoint.trainer_side import step_hook as progress  # noqa: E402


def per_call(fn, n: int) -> float:
    """Median µs per call over 5 rounds of n calls."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn(None, (), {})
        rounds.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(rounds)


def torch_step_cost(n: int, install) -> tuple[float, float]:
    """(bare, hooked) µs a step; `install` registers the hook (torch already imported)."""
    import torch

    model = torch.nn.Linear(10, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)

    def timed() -> float:
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(n):
                opt.step()
            rounds.append((time.perf_counter() - start) / n * 1e6)
        return statistics.median(rounds)

    timed()  # warm-up: the first rounds of a fresh optimizer are slower
    before = timed()
    install()
    hooked = timed()
    return before, hooked


def _median_us(fn, n: int) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(rounds)


def backward_cost(n: int) -> float:
    """µs of one `loss.backward()` of a 10x10 model (torch.autograd.backward as it is now)."""
    import torch

    model = torch.nn.Linear(10, 10)
    x = torch.randn(4, 10)

    def one() -> None:
        model(x).sum().backward()

    _median_us(one, n)  # warm-up
    return _median_us(one, n)


def compiled_call_cost(n: int) -> tuple[str, float, float]:
    """(what, bare µs, counted µs) of one call of a compiled step (jax.jit's, where JAX is
    installed: the image), bare and wrapped as jax_steps wraps the trainer's own."""
    from entrypoint.trainer_side import jax_steps

    try:
        import jax.numpy as jnp
        from jax import jit

        what, compiled, x = "jax.jit step (4x4 add)", jit(lambda a: a + 1), jnp.ones((4, 4))
        compiled(x).block_until_ready()
    except ImportError:
        what, compiled, x = "a Python function standing for it (no JAX here)", lambda a: a, 1
    counted = jax_steps.Counted(compiled)
    jax_steps._step = progress._jax_step
    bare = min(_median_us(lambda: compiled(x), n) for _ in range(3))
    wrapped = min(_median_us(lambda: counted(x), n) for _ in range(3))
    return what, bare, wrapped


def _model():
    import torch

    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(1000)))


def train_call_cost(calls: int) -> float:
    """µs of one `model.train()` on 1,000 modules."""
    return _median_us(_model().train, calls)


def forward_after_evaluation(calls: int, rounds: int) -> tuple[float, float, int]:
    """(µs, µs, hooks left): a training forward of 1,000 modules never evaluated, and after an
    evaluation; the fastest of 7 interleaved rounds each (this machine's noise is +-30%)."""
    import torch

    x = torch.randn(2, 4)
    never, evaluated = _model(), _model()
    evaluated.eval()
    with torch.no_grad():
        evaluated(x)
    evaluated.train()
    evaluated(x)  # the first forward in training removes the watch's hooks
    left = sum(len(m._forward_hooks) for m in evaluated.modules())
    a, b = [], []
    for _ in range(rounds):
        a.append(_median_us(lambda: never(x), calls))
        b.append(_median_us(lambda: evaluated(x), calls))
    return min(a), min(b), left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        inbox = Inbox(Path(tmp) / "stacks")
        env = inbox.env() | {"RANK": "0", "LOCAL_RANK": "0"}
        os.environ.update(env)
        share = args.steps / 200_000  # the torch figures' sizes follow --steps (smoke: a few)
        calls, rounds = max(2, round(200 * share)), max(1, min(7, round(7 * share)))
        try:
            backward_bare = backward_cost(max(100, args.steps // 100))
            without, with_hook = torch_step_cost(
                max(100, args.steps // 10), lambda: progress.install(env)
            )
            assert progress._reporter is not None
            progress._reporter.by_optimizer = False  # a loop with no torch optimizer
            backward_counted = backward_cost(max(100, args.steps // 100))
            train_bare = train_call_cost(calls)
            train_hooked = train_call_cost(calls)
            never, evaluated, left = forward_after_evaluation(max(2, calls // 10), rounds)
        except ImportError:
            print("torch not installed: no optimizer-step figure")
        else:
            print(
                f"torch SGD step (10x10): {without:.2f} µs bare, {with_hook:.2f} µs hooked, "
                f"{with_hook - without:+.2f} µs a step"
            )
            print(
                f"loss.backward() (10x10), no torch optimizer: {backward_bare:.2f} µs bare, "
                f"{backward_counted:.2f} µs counted as a step, "
                f"{backward_counted - backward_bare:+.2f} µs a step"
            )
            print(
                f"model.train() on 1,000 modules: {train_bare:.0f} µs bare, {train_hooked:.0f} "
                f"µs hooked ({train_hooked - train_bare:+.0f} µs a call)"
            )
            print(
                f"training forward of 1,000 modules: {never:.0f} µs never evaluated, "
                f"{evaluated:.0f} µs after an evaluation ({evaluated - never:+.0f} µs; hooks "
                f"left: {left})"
            )
        progress.install(env)
        what, bare, counted = compiled_call_cost(max(1000, args.steps // 10))
        print(
            f"{what}: {bare:.2f} µs bare, {counted:.2f} µs counted as a step, "
            f"{counted - bare:+.2f} µs a step"
        )
        reporter = progress._reporter
        assert reporter is not None
        hook = progress._on_optimizer_step
        usual = per_call(hook, args.steps)
        print(f"hook, steps faster than {progress.SEND_EVERY:g} s (usual): {usual:.2f} µs a step")
        saved = progress.SEND_EVERY
        progress.SEND_EVERY = 0.0
        every = per_call(hook, args.steps // 10)
        progress.SEND_EVERY = saved
        print(f"hook, a datagram every step (worst case): {every:.2f} µs a step")
        time.sleep(0.5)
        print(f"the inbox saw rank 0 at step {inbox.ranks[0].steps:,}")
        tracemalloc.start()
        for _ in range(1000):
            hook(None, (), {})
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(args.steps):
            hook(None, (), {})
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        print(f"traced memory after {args.steps:,} more steps: {after - before:+,} bytes")
        inbox.close()


if __name__ == "__main__":
    main()
