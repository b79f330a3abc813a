r"""Whether a numeric ``lr_outer`` lets x settle within the horizon of a stream.

A step far below the stable bound (:mod:`bilevel.solvers.online.auto`) is safe but can be too
small for the horizon: x then moves a fraction of the way to the minimiser of F_t in T rounds,
and the regret stays near that of standing still at x0. On
``drifting_quadratic(horizon=400, drift_inner=0.02, drift_outer=0.02)`` (rho_x = 0.1, so
mu_F ~ 0.1) every online method with ``lr_outer = 0.01`` ends at 0.16-0.19 of the regret of
standing still, where 0.03 gives 0.06-0.07 (docs/online.md).

The prediction: the method's round map, linearised at (x0, y0), J_r(gamma) = A_r + gamma D_r,
and the state after it (both affine in gamma for an unconstrained x;
:func:`bilevel.solvers.online.auto.affine_round_map`), on the rounds r = 1, 2, 4, ... up to T,
each played for the rounds up to the next from the start state:
``s_{t+1} = s_r' (gamma_t) + J_r(gamma_t) (s_t - s_0)``, where ``s_r'`` is the state one round
r after the start and gamma_t the method's own outer step of round t (a decaying gamma_t
decays here too). Its regret is ``sum_t ||grad F_1(x_t)||^2`` against ``T ||grad F_1(x0)||^2``
for x held at x0. The doubling rounds follow what changes with t (a window of stored estimates
filling, SF2OBO's K_t and every lam_t growing, F2OBO-SL's gamma_t = lr_outer t^-tau decaying)
with log2(T) linearisations, and within a piece the x step only falls from its round's. On a
quadratic stream without drift this is the method's own regret ratio up to the changes within
a piece; the drift adds to both. Measured on that stream (2026-11-29, seed 0), predicted
against played, at 0.01 / 0.03 / 0.1 / 0.3: F2OBO 0.169 / 0.063 / 0.027 / 0.016 against
0.174 / 0.061 / 0.019 / 0.007, F2OBO-SL 0.455 / 0.222 / 0.109 / 0.077 against 0.469 / 0.239 /
0.121 / 0.085, SF2OBO 0.183 / 0.069 / 0.029 / 0.018 against 0.189 / 0.068 / 0.022 / 0.009,
OAGD 0.167 / 0.064 / 0.030 / 0.019 against 0.171 / 0.061 / 0.021 / 0.009. One map for every
round missed some: round 1's (OAGD 0.51 / 0.22 / 0.071 / 0.024, SF2OBO 0.24 / 0.11 / 0.057 /
0.041: their first rounds are unlike the rest), round T's (F2OBO-SL's ran to 1e23 with the
larger steps of its first rounds).

:func:`settling` predicts the given step and, when it misses :data:`TARGET`, the steps of a
grid below the stable bound; ``OnlineSolver.check_settling`` refuses the step when some of
them reach the target (naming them), and plays it when none does (a horizon too short for any
step: nothing better to offer).
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.analysis import regret as _regret
from bilevel.solvers.online import auto

__all__ = ["TARGET", "Settling", "settling"]

#: the regret, over that of standing still at x0, a numeric step must be predicted to reach
TARGET = 0.1
#: the grid of the refusal's advice: the stable bound times these factors
GRID = tuple(2.0 ** (-k / 2) for k in range(1, 21))
#: the longest horizon predicted (each grid step plays the linearised map for every round)
MAX_ROUNDS = 20_000
#: the rounds at most whose grad F_1 a dense inner solve gives (evenly spaced, each standing for
#: the rounds up to the next): the closed form takes every round
DENSE_POINTS = 64
#: the regret oracles whose grad F_1 is cheap at every point of the prediction
ORACLES = ("closed form", "dense inner solve")

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # problem -> {key: Settling}


class Settling(NamedTuple):
    """The predicted regret ratio of ``lr_outer`` and, where it misses :data:`TARGET`, the
    grid steps (below the stable bound) predicted to reach it.

    Attributes:
        ratio: the predicted regret of ``lr_outer`` over that of standing still at x0.
        reaching: the grid steps predicted at most :data:`TARGET` (empty when ``ratio`` is
            at most the target, or when none is).
        rounds: the rounds the map was linearised on (1, 2, 4, ...: each plays the rounds up
            to the next).
    """

    ratio: float
    reaching: tuple[float, ...]
    rounds: tuple[int, ...]


def settling(solver, problem, oracle: str, bound: float | None) -> Settling | None:
    """Predict the regret ratio of ``solver``'s numeric ``lr_outer`` on ``problem`` (module
    docstring), cached per problem and solver; ``None`` where no prediction is made: a
    constrained x, an x of several arrays, a solver that draws minibatches (each round's map is
    then a draw's), a state too large for the Jacobian or without an ``x`` field, an
    ``oracle`` not in :data:`ORACLES`, or a horizon above :data:`MAX_ROUNDS`."""
    one_array = len(jax.tree.leaves(problem.x0)) == 1
    if problem.x_set is not None or oracle not in ORACLES or not one_array:
        return None
    if getattr(solver, "batch_size", None) is not None or problem.horizon > MAX_ROUNDS:
        return None
    key = (repr(solver), oracle, bound)
    cache = _CACHE.setdefault(problem, {})
    if key not in cache:
        cache[key] = _settling(solver, problem, oracle, bound)
    return cache[key]


def _settling(solver, problem, oracle: str, bound: float | None) -> Settling | None:
    state = solver.init(problem, jax.random.key(0))
    if not hasattr(state, "x"):
        return None
    T = problem.horizon
    steps = np.asarray(_steps(solver, jnp.arange(1, T + 1)), float)
    if not steps[0] > 0:
        return None
    rounds = tuple(2**k for k in range(T.bit_length()) if 2**k <= T)
    maps = [auto.affine_round_map(solver, problem, state, r) for r in rounds]
    if maps[0] is None:
        return None
    predict = _predictor(problem, oracle, rounds, maps, _x_rows(state), steps)
    lr = float(solver.lr_outer)
    ratio = predict(lr)
    reaching: tuple[float, ...] = ()
    if ratio > TARGET and bound is not None:
        reaching = tuple(s for s in (bound * f for f in GRID) if predict(s) <= TARGET)
    return Settling(ratio, reaching, rounds)


def _predictor(problem, oracle: str, rounds, maps, x_rows: np.ndarray, steps: np.ndarray):
    """``predict(lr) -> ratio``: round t played by the affine map of the last of ``rounds``
    at or before t, with the x step ``lr * steps[t - 1] / steps[r - 1]`` (``steps``: the
    method's gamma_t for its ``lr_outer``: only their ratios enter)."""
    T = problem.horizon
    shape = np.shape(jax.tree.leaves(problem.x0)[0])
    segment = np.searchsorted(np.asarray(rounds), np.arange(1, T + 1), side="right") - 1
    decay = steps / steps[np.asarray(rounds)[segment] - 1]
    # a dense inner solve per point costs up to y's size cubed: every k-th round stands for k
    every = 1 if oracle == "closed form" else max(1, -(-T // DENSE_POINTS))

    def predict(lr: float) -> float:
        s, xs = maps[0][4], np.empty((T, int(x_rows.sum())))
        with np.errstate(over="ignore", invalid="ignore"):  # a map unstable at lr runs away
            for t in range(T):
                xs[t] = s[x_rows]
                a, d, after_a, after_d, start = maps[segment[t]]
                gamma = lr * decay[t]
                s = after_a + gamma * after_d + (a + gamma * d) @ (s - start)
                if not np.all(np.isfinite(s)):
                    return math.inf
        points = jnp.asarray(xs[::every]).reshape((-1, *shape))  # the first is x0
        g = np.asarray(_grads(problem, points, problem.y0, oracle), np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            squares = np.sum(g.reshape(len(points), -1) ** 2, axis=1)
            if not squares[0] > 0:  # x0 is stationary: nothing to settle
                return 0.0
            ratio = float(np.mean(squares) / squares[0])
        return ratio if math.isfinite(ratio) else math.inf

    return predict


@jax.jit
def _steps(solver, rounds: jax.Array) -> jax.Array:
    """gamma_t of ``rounds`` (one compilation per solver structure: its floats are leaves)."""
    return jax.vmap(solver.outer_lr)(rounds)


@functools.partial(jax.jit, static_argnames=("oracle",))
def _grads(problem, xs: jax.Array, y0, oracle: str) -> jax.Array:
    """grad F_1 at each row of ``xs`` by the regret's ``oracle`` (the drift is not predicted)."""
    return jax.vmap(lambda x: _regret.hypergradient(problem, oracle, 1, x, y0, 0))(xs)


def _x_rows(state) -> np.ndarray:
    """The boolean mask of x's entries in the float part of ``state``."""
    marked = jax.tree.map(lambda a: jnp.zeros_like(a) if auto.is_float(a) else a, state)._replace(
        x=jax.tree.map(jnp.ones_like, state.x)
    )
    return np.asarray(auto.float_part(marked)) > 0.5
