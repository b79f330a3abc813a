"""Interrupts (Ctrl-C / SIGTERM) keep the work, the progress display, and the bad inputs of
``solve`` that must fail before anything is compiled."""

import io
import json
import os
import re
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
import bilevel.drivers.solve as driver
from bilevel.drivers import engine, programs
from bilevel.drivers.checkpoints import CHECKPOINT_FILE as _CHECKPOINT_FILE
from bilevel.drivers.progress import Progress, format_duration, format_rate


@pytest.fixture(scope="module")
def quad_sto():
    return bl.problems.quadratic(dx=4, dy=6, stochastic=True, n_samples=200)


@pytest.fixture(autouse=True)
def default_signal_handlers():
    """Python's own dispositions, whatever the test process inherited (a job started in the
    background by a shell has SIGINT ignored, and solve leaves an ignored signal alone)."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


SOLVER = dict(lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)
RUN = dict(steps=200, seeds=[0, 1], eval_every=20, progress=False)


def _signal_at(monkeypatch, where: str, step: int, sig=signal.SIGINT):
    """Send ``sig`` to this process once the run reaches ``step``: ``where="chunk"`` while the
    next chunk runs (its result is dropped), ``"bookkeeping"`` while its rows are recorded."""
    if where == "chunk":
        compiled = programs.program

        def compiled_with_signal(spec, *args, **kwargs):
            fn = compiled(spec, *args, **kwargs)
            if spec.kind != "chunk":
                return fn

            def call(problem, state):
                if int(np.asarray(state.k).max()) >= step:
                    os.kill(os.getpid(), sig)
                return fn(problem, state)

            return call

        monkeypatch.setattr(programs, "program", compiled_with_signal)
    else:
        evaluate = engine.Engine.evaluate

        def evaluate_with_signal(self, state, at):
            if at == step:
                os.kill(os.getpid(), sig)
            return evaluate(self, state, at)

        monkeypatch.setattr(engine.Engine, "evaluate", evaluate_with_signal)


@pytest.mark.parametrize(
    "where, sig, expected_step",
    [
        ("chunk", signal.SIGINT, 60),  # the chunk 60 -> 80 is dropped: the last evaluation is 60
        ("bookkeeping", signal.SIGINT, 60),  # the evaluation at 60 completes, then the stop
        ("chunk", signal.SIGTERM, 60),
    ],
)
def test_interrupt_keeps_history_checkpoint_and_resumes_bit_identical(
    quad_sto, tmp_path, monkeypatch, where, sig, expected_step
):
    solver = bl.solvers.make("f2sa", **SOLVER)
    straight = bl.solve(quad_sto, solver, **RUN)
    with monkeypatch.context() as patch:
        _signal_at(patch, where, 60, sig)
        with pytest.raises(bl.Interrupted) as info:
            bl.solve(quad_sto, solver, **RUN, checkpoint=tmp_path, checkpoint_interval=1e9)
    stop = info.value
    assert isinstance(stop, KeyboardInterrupt)  # uncaught, it ends a program as Ctrl-C does
    assert stop.signal == signal.Signals(sig).name and stop.checkpoint == tmp_path
    part = stop.result
    assert part.steps == expected_step and part.history.step.max() == expected_step
    assert f"interrupted at step {expected_step} of 200" in part.message
    # the partial result is the uninterrupted run's prefix, bit for bit
    prefix = straight.history[straight.history.step <= expected_step].reset_index(drop=True)
    cols = [c for c in prefix.columns if c != "seconds"]
    np.testing.assert_array_equal(part.history[cols].to_numpy(), prefix[cols].to_numpy())
    # the checkpoint was forced (the interval was not due) and is at that evaluation
    with np.load(tmp_path / _CHECKPOINT_FILE, allow_pickle=False) as npz:
        assert json.loads(str(npz["meta"]))["step"] == expected_step
    # handlers are restored: Python's default SIGINT handler is back, SIGTERM's default too
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    resumed = bl.solve(quad_sto, solver, **RUN, checkpoint=tmp_path)
    assert resumed.message.startswith("resumed; completed 200 steps")
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(straight.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(resumed.history.grad_norm, straight.history.grad_norm)


def test_interrupt_without_checkpoint_still_returns_the_partial_result(quad_sto, monkeypatch):
    solver = bl.solvers.make("f2sa", **SOLVER)
    _signal_at(monkeypatch, "chunk", 40)
    with pytest.raises(bl.Interrupted) as info:
        bl.solve(quad_sto, solver, **RUN)
    assert info.value.checkpoint is None and info.value.result.steps == 40
    assert np.asarray(info.value.result.x).shape == (2, 4)


def test_an_ignored_signal_stays_ignored(quad_sto, monkeypatch):
    """A process that ignores SIGINT (a shell's background job) is not made interruptible."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    solver = bl.solvers.make("f2sa", **SOLVER)
    _signal_at(monkeypatch, "chunk", 40)
    res = bl.solve(quad_sto, solver, **RUN)  # the signal is sent, and ignored
    assert res.steps == 200 and res.message == "completed 200 steps"
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_resume_says_so(quad_sto, tmp_path, capsys):
    solver = bl.solvers.make("f2sa", **SOLVER)
    bl.solve(quad_sto, solver, steps=40, eval_every=20, progress=False, checkpoint=tmp_path)
    capsys.readouterr()
    bl.solve(quad_sto, solver, steps=60, eval_every=20, progress=True, checkpoint=tmp_path)
    err = capsys.readouterr().err
    assert f"resuming from step 40 (checkpoint in {tmp_path})" in err


# ---- progress -----------------------------------------------------------------------------------
def test_progress_prints_one_line_per_evaluation_off_a_terminal(quad_sto, capsys):
    solver = bl.solvers.make("f2sa", **SOLVER)
    bl.solve(quad_sto, solver, steps=60, eval_every=20, progress=True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("f2sa on quadratic(dx=4, dy=6")
    steps = [re.search(r"step ([\d,]+)/60", line).group(1) for line in lines[1:]]
    assert steps == ["0", "20", "40", "60"]
    assert "steps/s" in lines[-1] and "eta 0:00:0" in lines[-1] and "grad_norm" in lines[-1]


@pytest.mark.parametrize("width", [80, 120])
def test_progress_bar_fits_the_terminal(width):
    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None)
    name = "quadratic(dx=10, dy=50, cond=10.0, stochastic) with a long description"
    bar = Progress(True, 400_000, "f2sa", name, n_seeds=5, console=console)
    rows = [{"seed": 0, "step": 2000, "samples": 128_000, "grad_norm": 0.5}]
    bar.update(2000, rows)
    bar.clock.first = (bar.clock.first[0] - 1.0, 1000)  # 1000 steps in the last second
    bar.update(4000, rows)
    bar.bar.refresh()
    bar.close()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue()).replace("\r", "\n")
    last = [line for line in text.splitlines() if "/400,000" in line][-1]
    assert len(last.rstrip()) <= width
    assert "4,000/400,000" in last and "steps/s" in last and re.search(r"eta \d:\d\d:\d\d", last)
    assert ("grad_norm 5.000e-01" in last) == (width >= 100)


def test_rate_and_duration_formats():
    assert format_rate(12_345.0) == "12.3k steps/s" and format_rate(0.456) == "0.456 steps/s"
    assert format_rate(None) == "-- steps/s"
    assert format_duration(3725) == "1:02:05" and format_duration(None) == "--:--"


# ---- bad inputs ---------------------------------------------------------------------------------
def test_seeds_as_a_count_is_a_clear_error(quad_sto):
    solver = bl.solvers.make("f2sa", **SOLVER)
    with pytest.raises(TypeError, match=r"seeds is a list of seeds, not a count.*seeds=range\(5\)"):
        bl.solve(quad_sto, solver, steps=2, seeds=5, progress=False)
    with pytest.raises(TypeError, match=r"sequence of ints"):
        bl.solve(quad_sto, solver, steps=2, seeds=["a"], progress=False)


def test_checkpoint_path_that_is_a_file_fails_before_running(quad_sto, tmp_path, monkeypatch):
    solver = bl.solvers.make("f2sa", **SOLVER)
    path = tmp_path / "ckpt"
    path.write_text("not a directory")
    monkeypatch.setattr(driver, "init_states", lambda *a: pytest.fail("compiled before the check"))
    with pytest.raises(ValueError, match=r"checkpoint=.*ckpt'\) is a file, not a directory"):
        bl.solve(quad_sto, solver, steps=2, checkpoint=path, progress=False)


def _f(x, y, batch):
    return jnp.sum((y - x) ** 2)


def test_vector_metric_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"metrics=...\) entry 'err' has shape \(3,\).*scalar"):
        bl.BilevelProblem(
            outer=_f, inner=_f, x0=jnp.zeros(3), y0=jnp.zeros(3), metrics=lambda x, y: {"err": x}
        )
    with pytest.raises(ValueError, match=r"must return a dict"):
        bl.BilevelProblem(
            outer=_f, inner=_f, x0=jnp.zeros(3), y0=jnp.zeros(3), metrics=lambda x, y: x.sum()
        )


@pytest.mark.parametrize(
    "x_set, detail",
    [
        (bl.sets.Box(jnp.zeros((4, 1)), 1.0), "fails with"),  # does not broadcast
        (bl.sets.Box(jnp.zeros((1, 4)), 1.0), r"has shapes \(5, 4\), x0 has \(5, 1\)"),  # widens
    ],
)
def test_x_set_that_does_not_fit_x0_names_x_set(x_set, detail):
    x0 = jnp.zeros((5, 1))
    with pytest.raises(ValueError, match=r"x_set=Box\(...\)\) does not fit x0.*" + detail):
        bl.BilevelProblem(outer=_f, inner=_f, x0=x0, y0=x0, x_set=x_set)


def test_concave_inner_problem_warns_even_with_an_explicit_lr_inner():
    def concave(x, y, batch):
        return -jnp.sum((y - x) ** 2)

    p = bl.BilevelProblem(outer=_f, inner=concave, x0=jnp.zeros(3), y0=jnp.zeros(3))
    solver = bl.solvers.make("f2sa", lr_outer=0.01, lr_inner=0.01)
    with pytest.warns(bl.NotStronglyConvexWarning, match="not strongly convex in y"):
        bl.solve(p, solver, steps=1, progress=False)


def test_batch_size_on_a_deterministic_problem_is_refused():
    p = bl.problems.quadratic(dx=3, dy=4)
    with pytest.raises(ValueError, match=r"batch_size=32 but quadratic.*is deterministic"):
        bl.solve(p, bl.solvers.make("f2sa", batch_size=32), steps=2, progress=False)
    # a method's own default minibatch size (PZOBO-S: 256) is not the user's request
    assert bl.solvers.make("pzobo-s").batch_size == 256
    bl.solvers.make("pzobo-s").check_problem(p)


def _interrupt_online_rounds(monkeypatch, at_call: int):
    """SIGINT while the ``at_call``-th compiled chunk of online rounds runs (0 = the first)."""
    compiled, calls = programs.program, []

    def compiled_with_signal(spec, *args, **kwargs):
        fn = compiled(spec, *args, **kwargs)
        if spec.kind != programs.ONLINE_ROUNDS:
            return fn

        def call(problem, state):
            calls.append(1)
            if len(calls) == at_call + 1:
                os.kill(os.getpid(), signal.SIGINT)
            return fn(problem, state)

        return call

    monkeypatch.setattr(programs, "program", compiled_with_signal)


@pytest.mark.parametrize("at_call, rounds", [(0, 0), (2, 8)])
def test_an_online_interrupt_keeps_the_rounds_done_even_none(monkeypatch, at_call, rounds):
    """A stop during the first chunk is an Interrupted with zero rounds, not a TypeError from
    joining no chunks (it was, when a time limit stopped a run while its program compiled)."""
    problem = bl.problems.oscillating(horizon=20)
    solver = bl.solvers.make("f2obo", lr_outer=0.05, lr_inner=0.1, inner_steps=2)
    _interrupt_online_rounds(monkeypatch, at_call)
    with pytest.raises(bl.Interrupted) as info:
        bl.solve_online(problem, solver, seeds=[0, 1], eval_every=4, progress=False)
    res = info.value.result
    assert len(res.history) == 2 * rounds and np.shape(res.regret) == (2, rounds)
    x_dim = np.size(problem.x0)
    assert np.shape(res.xs) == (2, rounds, x_dim) and np.shape(res.regret_terms) == (2, rounds)
