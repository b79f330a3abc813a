"""The programs of ``bl.solve_online``: a chunk of rounds, and the evaluation of its trace.

Both are per-seed builders ``build(spec) -> fn(solver, problem, state)`` that
:func:`bilevel.drivers.programs.program` maps over the seeds and compiles (the engine's
``step_program`` and ``record`` hooks, :class:`bilevel.drivers.online.OnlineEngine`). The
evaluation gives, for every round t, the metrics at the committed ``(x_t, y_t)`` and the term
||G_X(x_t, grad F_t(x_t), gamma)||^2 of the bilevel local regret of Jia & Chen, "Fully
first-order algorithms for online non-convex bilevel optimization" (2026), eq. (2)
(:mod:`bilevel.analysis.regret`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.analysis import regret as _regret
from bilevel.analysis.metrics import loss_metrics
from bilevel.core.oracles import Counts
from bilevel.core.tree import tree_allfinite
from bilevel.drivers.programs import ProgramSpec, float_leaves_finite

PyTree = Any

__all__ = ["EVAL_BATCH", "RoundTrace", "RoundEvaluation", "rounds_program"]

#: rounds evaluated side by side (``lax.map``'s batch) after each chunk: the dense regret
#: oracle holds one Hessian per round of a batch
EVAL_BATCH = 16


class RoundTrace(NamedTuple):
    """What a chunk keeps of each round it played."""

    t: jax.Array  # the round
    x: PyTree  # x_t, committed before the round's update
    y: PyTree  # y_t
    counts: Counts  # the counts after the round
    solver_metrics: dict  # Solver.state_metrics after the round (its step's direction norm)


def rounds_program(spec: ProgramSpec) -> Callable:
    """The per-seed step program: ``spec.length`` rounds in one ``lax.scan``;
    ``(state, trace, finite)``."""

    def rounds(solver, problem, state):
        def body(s, _):
            x, y = solver.output(s)
            new = solver.round(problem, s)
            return new, RoundTrace(s.t, x, y, new.counts, solver.state_metrics(new))

        state, trace = jax.lax.scan(body, state, None, length=spec.length)
        return state, trace, float_leaves_finite(state)

    return rounds


@dataclasses.dataclass(frozen=True)
class RoundEvaluation:
    """The builder of the program evaluating a chunk's trace: per round the metrics, the
    regret term and the gamma it used, and whether the round is finite.

    Attributes:
        oracle: how grad F_t is obtained (``bilevel.analysis.regret``), ``None``: no regret.
        regret_step: the gamma of the gradient mapping (``None``: the solver's gamma_t).
        reference_steps: gradient steps of a reference solve's inner problem.
    """

    oracle: str | None
    regret_step: float | None
    reference_steps: int

    @property
    def kind(self) -> tuple:
        """Its compile-cache kind: everything static the program depends on."""
        return ("online-evaluation", self.oracle, self.regret_step, self.reference_steps)

    def __call__(self, spec: ProgramSpec) -> Callable:
        def evaluate(solver, problem, trace):
            def per_round(args):
                t, x, y = args
                return _round_evaluation(problem, solver, t, x, y, self)

            metrics, term, gamma = jax.lax.map(
                per_round, (trace.t, trace.x, trace.y), batch_size=EVAL_BATCH
            )
            metrics.update(trace.solver_metrics)
            iterates = jax.vmap(lambda x, y: tree_allfinite((x, y)))(trace.x, trace.y)
            values = jnp.stack([jnp.isfinite(v) for v in metrics.values()]).all(axis=0)
            return metrics, term, gamma, iterates & values

        return evaluate


def _round_evaluation(problem, solver, t, x, y, how: RoundEvaluation):
    """One round's metrics on its evaluation data, regret term
    ||G_X(x_t, grad F_t(x_t), gamma)||^2 (eq. (2) of Jia & Chen, 2026) and gamma."""
    f, g = problem.at_round(t)
    outer_data, inner_data = problem.evaluation_data(t)
    own = {} if problem.metrics is None else dict(problem.metrics(t, x, y))
    metrics = loss_metrics(f, g, x, y, outer_data, inner_data, skip=own)
    metrics.update({k: jnp.asarray(v) for k, v in own.items()})
    step = how.regret_step
    gamma = solver.outer_lr(t) if step is None else jnp.asarray(step)
    gamma = jnp.asarray(gamma, jnp.result_type(float))
    if how.oracle is None:
        return metrics, jnp.full((), jnp.nan, gamma.dtype), gamma
    grad = _regret.hypergradient(problem, how.oracle, t, x, y, how.reference_steps)
    return metrics, _regret.regret_term(problem.x_set, x, grad, gamma), gamma
