"""Which calls of a JAX trainer count as its steps (entrypoint/trainer_side/jax_steps.py). JAX is
not in the test environment: `transform` below stands for jax.jit, returning an object with
`lower` as JAX's compiled functions have. Real JAX processes, counted and named when one hangs,
are in tests/cluster/test_ranks.py."""

from __future__ import annotations

import functools
import select
import threading
import time
import types

import pytest

from entrypoint.trainer_side import jax_steps


class Compiled:
    def __init__(self, function, **options):
        self.function, self.options = function, options
        functools.update_wrapper(self, function)  # as JAX's compiled functions do

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def lower(self, *args):
        return ("lowered", args)


def transform(fun=None, **options):
    """jax.jit's two forms: jit(f, ...) and, without the function, a decorator."""
    if fun is None:
        return lambda f: Compiled(f, **options)
    return Compiled(fun, **options)


@pytest.fixture
def jax():
    events: list[str] = []
    module = types.ModuleType("jax")
    module.jit, module.pmap = transform, transform
    jax_steps.on_jax(module, lambda own: events.append("step"))
    module.events = events
    yield module
    jax_steps._step = None


def test_each_call_of_the_trainers_compiled_step_is_a_step(jax):
    train_step = jax.jit(lambda w: w + 1)
    w = 0
    for _ in range(3):
        w = train_step(w)
    assert w == 3 and jax.events == ["step"] * 3


def test_calls_inside_a_counted_call_and_from_other_threads_are_not_steps(jax):
    inner = jax.jit(lambda x: x * 2)
    outer = jax.jit(lambda x: inner(x) + 1)  # inner runs while outer is traced
    assert outer(1) == 3 and jax.events == ["step"]
    thread = threading.Thread(target=inner, args=(1,))  # a prefetching thread's call
    thread.start()
    thread.join()
    assert jax.events == ["step"]


def test_a_call_that_raises_is_no_step_and_the_next_one_counts(jax):
    def fails(x):
        raise ValueError(x)

    broken, fine = jax.jit(fails), jax.jit(lambda x: x)
    with pytest.raises(ValueError):
        broken(1)
    assert fine(2) == 2 and jax.events == ["step"]


def test_a_librarys_compiled_helpers_are_not_steps(jax):
    """jax.jit called from an installed package's file (jax.numpy, Optax, Flax): not counted."""
    library: dict = {"jax": jax}
    code = compile("helper = jax.jit(lambda x: x - 1)", "/venv/site-packages/optax/lib.py", "exec")
    exec(code, library)  # noqa: S102 - a module's code, as an import runs it
    assert library["helper"](5) == 4 and jax.events == []
    assert not isinstance(library["helper"], jax_steps.Counted)


def test_the_compiled_functions_own_attributes_the_decorator_forms_and_methods(jax):
    @functools.partial(jax.jit, static_argnums=0)
    def scaled(k, x):
        return k * x

    assert scaled.lower(1, 2) == ("lowered", (1, 2)) and scaled.options == {"static_argnums": 0}
    assert scaled.__name__ == "scaled"

    @jax.jit(donate_argnums=0)  # jax.jit used as a decorator factory
    def donated(x):
        return x

    class Model:
        def __init__(self):
            self.k = 10

        @jax.pmap
        def step(self, x):
            return self.k + x

    assert scaled(3, 2) == 6 and donated(7) == 7 and Model().step(1) == 11
    assert Model.step is Model.__dict__["step"]
    assert jax.events == ["step"] * 3


def test_counting_is_installed_once(jax):
    jit = jax.jit
    jax_steps.on_jax(jax, lambda own: None)
    assert jax.jit is jit


def test_the_sampler_tells_the_main_threads_own_work_from_its_waits_in_jax():
    """A real sampler thread on this thread: 0.5 s in the trainer's own code (a sleep, as a slow
    data loader's) is own work; 0.5 s inside a function of JAX's files (a blocked dispatch) is
    not."""
    # select, not time.sleep: a C call, as a blocked dispatch is (`make test-profile` wraps
    # time.sleep in a Python function of its own, which would be the innermost frame)
    waiting: dict = {"select": select}
    in_jax = "/venv/site-packages/jax/_src/array.py"
    exec(compile("def wait(): select.select([], [], [], 0.5)", in_jax, "exec"), waiting)  # noqa: S102
    sampler = jax_steps.Sampler(threading.get_ident())
    time.sleep(0.5)
    own = sampler.take()
    waiting["wait"]()
    waited = sampler.take()
    assert 0.3 < own < 0.8 and waited < 0.15, (own, waited)


def test_a_counted_function_can_be_copied(jax):
    """copy.copy makes the object before its __wrapped__ is set: no endless lookup."""
    import copy

    step = jax.jit(len)
    twin = copy.copy(step)
    assert twin((1, 2)) == 2 and twin.lower(1) == ("lowered", (1,))
