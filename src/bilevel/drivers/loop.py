"""``iterate``: the pure loop of solver steps, the program every ``bl.solve`` chunk compiles.

Everything else in the drivers (evaluations, history, divergence stops, checkpoints) happens
between calls of this loop, outside the compiled region; see :mod:`bilevel.drivers.engine`.
"""

from __future__ import annotations

from typing import Any

import jax

from bilevel.core.problem import BilevelProblem
from bilevel.solvers.base import Solver

__all__ = ["iterate"]


def iterate(solver: Solver, problem: BilevelProblem, state: Any, num_steps: int) -> Any:
    """``num_steps`` outer iterations of ``solver`` from ``state``: a ``lax.scan`` of
    ``solver.step``, with nothing else in the loop.

    This is the program ``bl.solve`` compiles for each chunk of ``eval_every`` steps (vmapped
    over its seeds), so ``iterate(solver, problem, solver.init(problem, key), K)`` ends in the
    state ``bl.solve(problem, solver, K, seed=s).state`` reports for the same resolved solver
    and ``key = jax.random.PRNGKey(s)``. Unlike ``solve`` it is a pure function of pytrees:

    - under ``jax.jit`` (``num_steps`` static: ``jax.jit(iterate, static_argnums=3)``);
    - under ``jax.vmap`` over a stack of solvers of one class whose numeric hyperparameters
      differ (a solver is a pytree whose float hyperparameters are leaves;
      ``bilevel.solvers.base``), over states (seeds), or over problems' data;
    - under ``jax.grad``: differentiating the final state, or a loss of it, with respect to a
      hyperparameter such as ``lr_outer`` is reverse-mode iterative differentiation through the
      unrolled optimisation (Franceschi, Donini, Frasconi & Pontil, "Forward and reverse
      gradient-based hyperparameter optimization", ICML 2017, Sec. 2.1: the hypergradient of
      the response of T iterations of a dynamics, computed backwards through them). The
      memory grows with ``num_steps``; wrap ``solver.step`` in ``jax.checkpoint`` yourself
      for long horizons.

    Args:
        solver: a resolved solver (``solver.resolve(problem)``; ``bl.solve`` does this, here
            it is yours to do, as is ``solver.with_horizon(K)`` for methods whose steps
            depend on the horizon).
        problem: a :class:`bilevel.BilevelProblem`.
        state: the solver's state, e.g. ``solver.init(problem, jax.random.PRNGKey(0))``.
        num_steps: the number of steps, a Python int (it sets the scan's length).

    Returns:
        The state after ``num_steps`` steps (the PRNG key and counters advanced too).
    """

    def body(current, _):
        return solver.step(problem, current), None

    final, _ = jax.lax.scan(body, state, None, length=num_steps)
    return final
