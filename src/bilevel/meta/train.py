"""The meta-training loop: one compiled step, timed training, fixed meta-test tasks.

:func:`meta_train` runs any meta-learner of :mod:`bilevel.meta.base`'s contract the way the
paper measures it (Sow, Ji, Liang, NeurIPS 2022, Fig. 4 and Table 1: meta-test accuracy against
wall-clock training time):

* the step (sample a meta-batch, then ``learner.step``) is compiled once, ahead of time, and its
  compilation is timed and reported apart (``MetaTrace.compile_seconds``);
* ``seconds`` counts the training steps only, each waited for (``block_until_ready``);
* meta-test accuracy is measured before training, every ``eval_every`` steps and at the end,
  outside the timed region, on the SAME ``eval_tasks`` tasks every time: their keys are drawn once
  from the run's key and the (deterministic) sampler redraws the same episodes from them in chunks
  of its meta-batch, so no image set is held in memory. Each row reports the mean over those tasks
  and the 95% interval ``1.96 std / sqrt(n)`` (:func:`mean_ci95`; the paper: 600 test tasks).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np
import pandas as pd

from bilevel.meta.heads import accuracy

__all__ = ["MetaTrace", "HISTORY_COLUMNS", "mean_ci95", "meta_train"]

#: the columns of :attr:`MetaTrace.history`
HISTORY_COLUMNS = ("step", "seconds", "train_loss", "test_accuracy", "test_ci95")


class MetaTrace(NamedTuple):
    """The outcome of :func:`meta_train`."""

    state: Any  # the learner's last state (the last one with a finite loss on an early stop)
    history: pd.DataFrame  # one row per evaluation, columns HISTORY_COLUMNS
    compile_seconds: float  # compiling the training step (not counted in ``seconds``)
    eval_seconds: float  # every meta-test evaluation, its compilation included (not counted)
    stopped: str | None  # why training ended before ``steps`` (None: all steps ran)
    final: tuple[float, float] | None = None  # (mean, ci95) on ``final_eval_tasks`` tasks


def mean_ci95(per_task_accuracies) -> tuple[float, float]:
    """``(mean, 1.96 * std / sqrt(n))``: the mean and the half-width of its 95% normal interval.

    ``std`` is the sample standard deviation (``ddof=1``) of the n per-task accuracies, the
    convention of few-shot papers' "mean +- 95% confidence interval over 600 tasks".
    """
    values = np.asarray(per_task_accuracies, dtype=float).ravel()
    if values.size < 2:
        raise ValueError(
            f"mean_ci95(per_task_accuracies=...) needs at least 2 tasks, got {values.size}."
        )
    return float(values.mean()), float(1.96 * values.std(ddof=1) / math.sqrt(values.size))


def _check_args(train_sampler, test_sampler, ways, steps, eval_every, eval_tasks, time_limit):
    for name, value in (("steps", steps), ("eval_every", eval_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"meta_train({name}=...) must be a positive int, got {value!r}.")
    if isinstance(eval_tasks, bool) or not isinstance(eval_tasks, int) or eval_tasks < 2:
        raise ValueError(
            f"meta_train(eval_tasks=...) must be an int >= 2 (the paper uses 600), got "
            f"{eval_tasks!r}."
        )
    if time_limit is not None and not (isinstance(time_limit, int | float) and time_limit > 0):
        raise ValueError(
            f"meta_train(time_limit=...) must be None or a positive number of training seconds, "
            f"got {time_limit!r}."
        )
    for name, sampler in (("train_sampler", train_sampler), ("test_sampler", test_sampler)):
        if not (callable(getattr(sampler, "sample", None)) and hasattr(sampler, "meta_batch")):
            raise ValueError(
                f"meta_train({name}=...) needs .sample(key) -> Episodes and .meta_batch "
                "(a bilevel.meta.episodes.EpisodeSampler)."
            )
        if getattr(sampler, "ways", ways) != ways:
            raise ValueError(
                f"meta_train(ways={ways}) differs from {name}.ways = {sampler.ways}; pass the "
                "samplers' number of ways."
            )


def _compile_evaluator(learner, test_sampler, eval_tasks: int, key: jax.Array, state):
    """A compiled ``state -> (eval_tasks,)`` per-task accuracies on fixed tasks.

    The tasks come from ``ceil(eval_tasks / meta_batch)`` keys drawn once here; the sampler
    redraws the same episodes from them at every call, one meta-batch at a time (``lax.map``).
    """
    chunks = -(-eval_tasks // test_sampler.meta_batch)
    keys = jax.random.split(key, chunks)

    arrays, rest = eqx.partition(test_sampler, eqx.is_array)

    def per_task(state, keys, arrays):
        sampler = eqx.combine(arrays, rest)

        def chunk(chunk_key):
            episodes = sampler.sample(chunk_key)
            logits = learner.query_logits(state, episodes)
            return jax.vmap(accuracy)(logits, episodes.query_labels)

        return jax.lax.map(chunk, keys).reshape(-1)[:eval_tasks]

    compiled = jax.jit(per_task).lower(state, keys, arrays).compile()
    return lambda state: np.asarray(compiled(state, keys, arrays))


def _compile_step(learner, train_sampler, state, key):
    """The training step ``(state, key) -> (state, loss)`` compiled ahead of time; raises if the
    learner's step changes the state's structure, shapes or dtypes (each step would recompile)."""

    # the sampler's arrays (the split's images) are an argument, not constants baked into
    # the program: closing over them made XLA copy 150 MB of Fashion-MNIST into each program
    arrays, rest = eqx.partition(train_sampler, eqx.is_array)

    def train_step(state, key, arrays):
        sample_key, step_key = jax.random.split(key)
        episodes = eqx.combine(arrays, rest).sample(sample_key)
        return learner.step(state, episodes, step_key)

    before = jax.eval_shape(lambda s: s, state)
    after = jax.eval_shape(train_step, state, key, arrays)[0]
    if jax.tree.structure(before) != jax.tree.structure(after) or before != after:
        raise ValueError(
            f"{type(learner).__name__}.step returns a state whose structure, shapes or dtypes "
            "differ from its input's; keep every field's dtype (cast updates to the parameters' "
            "dtype) so one compiled step serves the whole run."
        )
    compiled = jax.jit(train_step).lower(state, key, arrays).compile()
    return lambda state, key: compiled(state, key, arrays)


def meta_train(
    learner,
    backbone,
    *,
    train_sampler,
    test_sampler,
    ways: int,
    steps: int,
    eval_every: int,
    eval_every_seconds: float | None = None,
    eval_tasks: int = 600,
    final_eval_tasks: int | None = None,
    key: jax.Array,
    time_limit: float | None = None,
    log: Callable[[str], Any] | None = print,
) -> MetaTrace:
    """Meta-train ``learner`` from ``backbone``; meta-test accuracy against training time.

    Args:
        learner: a meta-learner (:class:`bilevel.meta.base.MetaLearner`: ``init``, ``step``,
            ``query_logits``), closed over by the compiled step.
        backbone: the initial backbone (an equinox module, images -> features).
        train_sampler, test_sampler: episode samplers (``.sample(key) -> Episodes``,
            ``.meta_batch``) over class-disjoint meta-train and meta-test classes.
        ways: classes per task (the heads' output size).
        steps: meta-steps to run.
        eval_every: meta-steps between evaluations (one more before training and at the end).
        eval_every_seconds: also evaluate once this many training seconds have passed since
            the last evaluation (None: steps only). Methods whose steps cost very different
            times then get evaluations equally spaced in time, which a time-to-accuracy table
            needs.
        eval_tasks: meta-test tasks of every evaluation, the same ones each time (default 600,
            the paper's count).
        final_eval_tasks: evaluate the last state once more on this many tasks (drawn from
            their own keys) into :attr:`MetaTrace.final`; None (default) does not. Lets a run
            whose method adapts slowly at meta-test (MAML) follow its curve on fewer tasks and
            still report the paper's 600 at the end.
        key: the run's PRNG key: split into the learner's init key, the training key (step k
            uses ``fold_in(training key, k)``) and the meta-test tasks' keys.
        time_limit: stop once the training time (the history's ``seconds``) reaches this many
            seconds, after an evaluation of the last state; None (default) runs all ``steps``.
        log: called with one line per evaluation and with the reason of an early stop; None is
            silent.

    Returns:
        :class:`MetaTrace`: the final state and the history, one row per evaluation with
        ``step``, ``seconds`` (training wall time so far: compilation and evaluation excluded),
        ``train_loss`` (mean query loss of the meta-batches since the previous row, each at the
        state before its update; at step 0 the first meta-batch's loss at the initial state, NaN
        if no step ran), ``test_accuracy`` (mean over the tasks, a fraction) and ``test_ci95``. A
        non-finite training loss stops the run with a message; the history so far is kept and
        ``state`` is the last state whose loss was finite.
    """
    _check_args(train_sampler, test_sampler, ways, steps, eval_every, eval_tasks, time_limit)
    _check_optional_args(final_eval_tasks, eval_every_seconds)
    say = log if log is not None else (lambda _: None)
    init_key, train_key, eval_key = jax.random.split(key, 3)
    state = learner.init(backbone, ways, init_key)

    start = time.perf_counter()
    step_fn = _compile_step(learner, train_sampler, state, train_key)
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    evaluate = _compile_evaluator(learner, test_sampler, eval_tasks, eval_key, state)
    progress = _Progress(learner.name, steps, eval_tasks, evaluate, say)
    progress.eval_seconds = time.perf_counter() - start
    progress.record(0, state)
    state, stopped = _train(
        step_fn,
        state,
        train_key,
        progress,
        eval_every=eval_every,
        eval_every_seconds=eval_every_seconds,
        time_limit=time_limit,
    )
    history = pd.DataFrame(progress.rows, columns=list(HISTORY_COLUMNS))
    final = None
    if final_eval_tasks is not None:
        final = _final_evaluation(
            learner, test_sampler, final_eval_tasks, eval_key, state, progress
        )
    return MetaTrace(state, history, compile_seconds, progress.eval_seconds, stopped, final)


def _check_optional_args(final_eval_tasks, eval_every_seconds) -> None:
    if final_eval_tasks is not None and (
        isinstance(final_eval_tasks, bool)
        or not isinstance(final_eval_tasks, int)
        or final_eval_tasks < 2
    ):
        raise ValueError(
            f"meta_train(final_eval_tasks=...) must be None or an int >= 2, got "
            f"{final_eval_tasks!r}."
        )
    if eval_every_seconds is not None and not (
        isinstance(eval_every_seconds, int | float) and eval_every_seconds > 0
    ):
        raise ValueError(
            f"meta_train(eval_every_seconds=...) must be None or a positive number, got "
            f"{eval_every_seconds!r}."
        )


@dataclasses.dataclass
class _Progress:
    """A run's bookkeeping: the history rows, the training losses since the last row, and the
    training and evaluation seconds so far."""

    name: str  # the learner's
    steps: int
    eval_tasks: int
    evaluate: Callable[[Any], np.ndarray]  # state -> per-task accuracies
    say: Callable[[str], Any]
    seconds: float = 0.0  # training time so far
    eval_seconds: float = 0.0
    rows: list[dict] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)

    def record(self, step: int, state) -> None:
        """Evaluate ``state``, append its row, log it and count the evaluation's time."""
        start = time.perf_counter()
        mean, ci = mean_ci95(self.evaluate(state))
        spent = time.perf_counter() - start
        loss = float(np.mean(self.losses)) if self.losses else float("nan")
        self.losses.clear()
        row = (step, self.seconds, loss, mean, ci)
        self.rows.append(dict(zip(HISTORY_COLUMNS, row, strict=True)))
        self.say(
            f"{self.name} step {step}/{self.steps}: {self.seconds:.1f} s, train loss "
            f"{loss:.4f}, test accuracy {100 * mean:.2f} +- {100 * ci:.2f} % "
            f"({self.eval_tasks} tasks)"
        )
        self.eval_seconds += spent


def _train(
    step_fn, state, train_key, progress: _Progress, *, eval_every, eval_every_seconds, time_limit
):
    """The timed training steps with their evaluations; ``(last finite state, why stopped
    early or None)``."""
    steps, stopped = progress.steps, None
    for k in range(steps):
        step_key = jax.random.fold_in(train_key, k)  # no (steps,) key array: steps may be huge
        start = time.perf_counter()
        new_state, loss = jax.block_until_ready(step_fn(state, step_key))
        progress.seconds += time.perf_counter() - start
        loss = float(loss)
        if not math.isfinite(loss):
            stopped = f"non-finite training loss ({loss}) at step {k + 1}; history kept to step {k}"
            progress.say(f"{progress.name}: stopped: {stopped}")
            break
        state = new_state
        progress.losses.append(loss)
        if k == 0:  # the first step's loss was taken at the initial state: row 0's
            progress.rows[0]["train_loss"] = loss
        seconds = progress.seconds
        if time_limit is not None and seconds >= time_limit and k + 1 < steps:
            stopped = f"time limit of {time_limit} training seconds reached after step {k + 1}"
        since = seconds - progress.rows[-1]["seconds"]
        due = eval_every_seconds is not None and since >= eval_every_seconds
        if (k + 1) % eval_every == 0 or k + 1 == steps or stopped or due:
            progress.record(k + 1, state)
        if stopped:
            progress.say(f"{progress.name}: stopped: {stopped}")
            break
    return state, stopped


def _final_evaluation(learner, test_sampler, tasks: int, eval_key, state, progress: _Progress):
    """``(mean, ci95)`` of ``state`` on ``tasks`` tasks drawn from their own keys."""
    start = time.perf_counter()
    final_key = jax.random.fold_in(eval_key, tasks)
    final_eval = _compile_evaluator(learner, test_sampler, tasks, final_key, state)
    final = mean_ci95(final_eval(state))
    progress.eval_seconds += time.perf_counter() - start
    progress.say(
        f"{learner.name} final: test accuracy {100 * final[0]:.2f} +- {100 * final[1]:.2f} % "
        f"({tasks} tasks)"
    )
    return final
