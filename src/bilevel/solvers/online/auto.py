r"""What an online solver settles from the run it is given: the stable outer step of its round
map, and the inner-step rules tied to the horizon (Theorem 3.1 of Jia & Chen, "Fully
First-Order Algorithms for Online Non-Convex Bilevel Optimization", arXiv:2602.11665, 2026).

**The stable outer step.** Every online method is a map of its state from round t to round
t + 1 (x, the inner iterates, a window of stored estimates, a momentum direction, ...). Its
Jacobian J_t(gamma) for the x step gamma = ``lr_outer`` decides whether a small error grows:
the method is linearly stable where no eigenvalue of J_t(gamma) leaves the unit disc. For plain
gradient steps on an L_F-smooth F this is the classical gamma < 2 / L_F (the eigenvalues
1 - gamma h_i of GD on a quadratic with curvatures h_i), inside which Theorems 3.1 and 4.1 take
gamma <= 1 / (2 L_F). The map also sees what that bound does not: inner iterates that lag x
(one or K steps per round: the coupling behind the second term of Theorem 3.1's step bound), a
window of w stored estimates (delayed gradients, stable only for a step about w times smaller),
a momentum direction. :func:`stable_outer_step` finds the least gamma at which J_t(gamma),
linearised at (x0, y0) on the first and on the last round of the horizon, has an eigenvalue of
modulus above 1 that is not real and positive. A real eigenvalue above 1 is an escape along
negative curvature of F_t (x0 near a maximum), which a step only scales and never creates: a
step too large shows as an overshoot (an eigenvalue below -1) or an oscillation (a complex
pair). A ring buffer of stored estimates (a ``window`` field holding a
:class:`~bilevel.solvers.online.window.Window`) is read by lag (the estimate of round t - 1 - i
in row i), in which frame the round map does not depend on t once the window is full. On a
quadratic stream every round map is affine, and the bound exact; elsewhere it is local to
(x0, y0).

J_t is formed densely (``jax.jacfwd``) when the state holds at most
:data:`MAX_JACOBIAN_ENTRIES` floats; for a larger state only the step scale 1 / rho(D) is
estimated (rho(D) the spectral radius of D = dJ_t/dgamma, by power iteration on
Jacobian-vector products), with no bound.

**Theorem 3.1's K.** F2OBO's inner steps K must grow like tau log T (Theorem 3.1):
K >= max{1 - ln 2 / ln rho, (ln c - 2 ln lambda_1 - 2 tau ln T) / ln rho}, i.e.
lambda_T^2 rho^K <= c, with rho = max(rho_y, rho_z) the per-step contraction of the squared
distances of the two inner sequences to their targets (rho_y = 1 - beta_t lambda_t mu_g / 2,
rho_z = 1 - alpha mu_g: the proof of Theorem 3.1, eqs. (17)-(19)). :func:`penalty_inner_steps`
takes c = 1: the last round's penalty-amplified inner contraction lambda_T rho^(K/2) is at most
1. OBBO's unrolled K is the same kind of rule, T rho_z^K <= 1 (:func:`unrolled_inner_steps`).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bilevel.solvers.online.window import Window

__all__ = [
    "MAX_JACOBIAN_ENTRIES",
    "StepBound",
    "stable_outer_step",
    "penalty_inner_steps",
    "unrolled_inner_steps",
    "inner_contraction",
    "affine_round_map",
    "round_offsets",
    "float_part",
    "is_float",
]

#: float entries of a solver's state up to which the round map's Jacobian is formed densely
MAX_JACOBIAN_ENTRIES = 1024
#: the scan of gamma for the bound: 2^k / rho(D) for k in this range, then bisection
_SCAN = range(-14, 9)
_BISECT = 14
#: an eigenvalue is outside the unit disc when its modulus exceeds 1 by more than this
_TOL = 1e-7

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # problem -> {solver: bound}


class StepBound(NamedTuple):
    """The stable outer step of a solver on a problem (:func:`stable_outer_step`).

    Attributes:
        bound: the largest stable ``lr_outer`` (``None``: not computed, the state being too
            large, or no instability up to 2^8 / rho(D)).
        scale: 1 / rho(D), D = dJ_t/dgamma on the last round: the step at which an x step
            moves x by about its own size along the stiffest direction (1 / L_F for an exact
            gradient step).
        rounds: the rounds linearised.
    """

    bound: float | None
    scale: float
    rounds: tuple[int, ...]

    def describe(self) -> str:
        """How the bound was obtained, in words (for messages and ``OnlineResult.tuning``)."""
        where = " and ".join(str(t) for t in self.rounds)
        return f"the method's round map, linearised at (x0, y0) on round {where}"


def stable_outer_step(solver, problem) -> StepBound:
    """The largest stable ``lr_outer`` of ``solver`` (resolved but for ``lr_outer``) on
    ``problem`` (module docstring), cached per problem and solver settings.

    Args:
        solver: an online solver whose ``outer_optimizer`` is ``"sgd"`` or ``"momentum"``
            (its update is linear in ``lr_outer``).
        problem: the :class:`bilevel.OnlineProblem`.
    """
    key = repr(dataclasses.replace(solver, lr_outer=1.0))
    cache = _CACHE.setdefault(problem, {})
    if key not in cache:
        cache[key] = _compute(solver, problem)
    return cache[key]


def _compute(solver, problem) -> StepBound:
    T = problem.horizon
    rounds = tuple(sorted({1, T}))
    state = solver.init(problem, jax.random.key(0))
    flat = _float_part(state)[0]
    if flat.size > MAX_JACOBIAN_ENTRIES:
        return StepBound(None, 1.0 / _power_radius(solver, problem, state), rounds)
    jac = _JACOBIANS[bool(solver.linearise_by_differences)]

    def at(t: int, lr: float) -> np.ndarray:  # round t's Jacobian at (x0, y0), by lag
        start = state._replace(t=jnp.asarray(t, state.t.dtype))
        return _unread_rows_zeroed(np.asarray(jac(flat, _with_lr(solver, lr), start, problem)))

    pairs = {t: (at(t, 1.0), at(t, 2.0)) for t in rounds}
    _check_finite(solver, pairs)
    ones, twos = pairs[T]
    radius = float(np.max(np.abs(np.linalg.eigvals(twos - ones)))) if flat.size else 0.0
    scale = 1.0 / radius if radius > 0 else 1.0
    bounds = []
    for t in rounds:
        if problem.x_set is None:  # x - lr d: the Jacobian is affine in lr
            ones, twos = pairs[t]

            def jacobian(lr, a=2 * ones - twos, d=twos - ones):
                return a + lr * d

        else:

            def jacobian(lr, t=t):
                return at(t, lr)

        bounds.append(_first_instability(jacobian, scale))
    found = [b for b in bounds if b is not None]
    return StepBound(min(found) if found else None, scale, rounds)


def affine_round_map(solver, problem, state, t: int):
    """Round ``t``'s map of ``solver`` at ``state`` (x0, y0), affine in ``lr_outer`` for an
    unconstrained x: ``(A, D, s)`` with the Jacobian ``A + gamma D`` and the float part ``s``
    of ``state`` (float64 numpy), in the lag frame of a window (:func:`_by_lag`); ``None`` for a
    state of more than :data:`MAX_JACOBIAN_ENTRIES` floats. The state after each round is
    :func:`round_offsets`'. Used by :mod:`bilevel.solvers.online.settling`."""
    start = state._replace(t=jnp.asarray(t, state.t.dtype))
    flat = _float_part(_by_lag(start, start.t, to_ring=False))[0]
    if flat.size > MAX_JACOBIAN_ENTRIES or flat.size == 0:
        return None
    jac = _JACOBIANS[bool(solver.linearise_by_differences)]
    ones, twos = (
        _unread_rows_zeroed(np.asarray(jac(flat, _with_lr(solver, lr), start, problem)))
        for lr in (1.0, 2.0)
    )
    return 2 * ones - twos, twos - ones, np.asarray(flat, np.float64)


def round_offsets(solver, problem, state, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """The state after each round t = 1..``horizon`` of ``solver`` from ``state`` (x0, y0),
    affine in ``lr_outer`` for an unconstrained x: ``(a, d)`` of shape (T, n), the state after
    round t being ``a[t - 1] + gamma d[t - 1]`` (float64, in the lag frame of a window). The
    constant parts of the rounds' maps: where the stream drifts, round t's own target, which
    the Jacobians of :func:`affine_round_map` do not carry."""
    rounds = jnp.arange(1, horizon + 1, dtype=state.t.dtype)
    after_1, after_2 = (
        np.asarray(_AFTER_ROUNDS(_with_lr(solver, lr), state, problem, rounds), np.float64)
        for lr in (1.0, 2.0)
    )
    return 2 * after_1 - after_2, after_2 - after_1


def float_part(state) -> jax.Array:
    """The float entries of ``state``, flat (the iterates a round maps)."""
    return _float_part(state)[0]


def is_float(leaf) -> bool:
    """Whether a leaf of a state is one of its float iterates."""
    return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating)


def _unread_rows_zeroed(jacobian: np.ndarray) -> np.ndarray:
    """The Jacobian (float64) with the rows of the state entries that no entry reads set to 0.
    Those are the solver's own diagnostics (a norm of the last direction or inner gradient):
    they do not feed the round map, so they only add eigenvalues 0, but the derivative of a
    norm at 0 is NaN, which would make the whole spectrum NaN (seen on a stream whose inner
    step lands exactly on y*)."""
    m = np.array(jacobian, np.float64)
    finite_rows = np.isfinite(m).all(axis=1)
    unread = np.all(np.where(finite_rows[:, None], m, 0.0) == 0.0, axis=0) & ~finite_rows
    m[unread, :] = 0.0
    return m


def _check_finite(solver, pairs: dict) -> None:
    """Refuse round maps whose linearisation is not finite (a ValueError naming the round):
    the method's other steps overflow within one round there, whatever ``lr_outer`` is."""
    bad = [t for t, (a, b) in pairs.items() if not (np.isfinite(a).all() and np.isfinite(b).all())]
    if bad:
        raise ValueError(
            f"{solver.name}: one round of the method at (x0, y0) is not finite on round "
            f"{bad[0]} of the stream (its Jacobian has NaN/inf), whatever lr_outer is: its "
            "inner steps overflow there. Lower the inner step sizes given as numbers (e.g. "
            "lr_inner), or leave them 'auto' (rescaled to the curvature of the round)."
        )


def _with_lr(solver, lr: float):
    return dataclasses.replace(solver, lr_outer=float(lr))


def _float_part(state):
    """``(flat floats of the state, mask of its float leaves)``: the iterates a round maps
    (counts, the round and the key are not floats)."""
    leaves = jax.tree.leaves(state)
    mask = [is_float(a) for a in leaves]
    floats = [a for a, m in zip(leaves, mask, strict=True) if m]
    return ravel_pytree(floats)[0], mask


def _by_lag(state, t, to_ring: bool):
    """``state`` with its ring buffer of stored estimates (a ``window`` field) read by lag
    (row i: the estimate of round t - 1 - i, before round t) from the ring layout (slot s:
    round r with (r - 1) mod w = s), or back (``to_ring``); other states as they are."""
    window = getattr(state, "window", None)
    if not isinstance(window, Window):
        return state
    w, rows = window.size, jnp.arange(window.size)
    # before round t, lag i is in slot (t - 2 - i) mod w, so ring[s] = lag[(t - 2 - s) mod w];
    # after it, lag i (round t - i) is in slot (t - 1 - i) mod w
    index = (t - 2 - rows) % w if to_ring else (t - 1 - rows) % w
    moved = jax.tree.map(lambda a: a[index], window.estimates)
    return state._replace(window=Window(moved))


def _advance(flat, solver, state, problem):
    """The float part of the state after round ``state.t`` of ``solver`` from ``flat`` (the
    other leaves of ``state`` fixed), a ring buffer read by lag on both sides
    (:func:`_by_lag`)."""
    leaves, treedef = jax.tree.flatten(state)
    _, mask = _float_part(state)
    unravel = ravel_pytree([a for a, m in zip(leaves, mask, strict=True) if m])[1]
    it = iter(unravel(flat))
    lagged = treedef.unflatten([next(it) if m else a for a, m in zip(leaves, mask, strict=True)])
    new = solver.round(problem, _by_lag(lagged, state.t, to_ring=True))
    return _float_part(_by_lag(new, state.t, to_ring=False))[0]


def _by_differences(flat, solver, state, problem):
    """:func:`_advance`'s Jacobian by central differences (exact for an affine round map up to
    rounding)."""
    eps = 1e-3 * jnp.maximum(1.0, jnp.abs(flat))
    steps = jnp.diag(eps)
    plus = jax.vmap(lambda e: _advance(flat + e, solver, state, problem))(steps)
    minus = jax.vmap(lambda e: _advance(flat - e, solver, state, problem))(steps)
    return ((plus - minus) / (2 * eps)[:, None]).T


def _after_round(solver, state, problem, t):
    """The float part of the state after round ``t`` of ``solver`` from ``state``'s iterates,
    by lag (:func:`_advance` at round ``t``)."""
    start = state._replace(t=t)
    return _advance(_float_part(_by_lag(start, t, to_ring=False))[0], solver, start, problem)


#: ``after(solver, state, problem, rounds) -> (T, n)``: :func:`_after_round` for every round
_AFTER_ROUNDS = jax.jit(jax.vmap(_after_round, in_axes=(None, None, None, 0)))

#: ``jac(flat, solver, state, problem)``: the Jacobian of a round in the float part of the
#: state, by forward mode or (for a round that holds a value constant with ``stop_gradient``,
#: which forward mode reads as no dependence: OBBO's ITD warm start) by central differences.
#: The solver's float hyperparameters are leaves and ``t`` an argument: solvers that differ
#: only in those share one compilation per problem, and the stable bound and the settling
#: prediction share it too.
_JACOBIANS = {False: jax.jit(jax.jacfwd(_advance)), True: jax.jit(_by_differences)}


def _count_unstable(matrix: np.ndarray) -> int:
    """Eigenvalues outside the unit disc that are not real and positive: those are the ones a
    step makes (an overshoot, z < -1, or an oscillation, a complex pair); a real z > 1 is an
    escape along negative curvature, which the step only scales."""
    z = np.linalg.eigvals(matrix) if matrix.size else np.zeros(0)
    real_positive = (np.abs(z.imag) <= 1e-6 * np.abs(z)) & (z.real > 0)
    return int(np.sum((np.abs(z) > 1.0 + _TOL) & ~real_positive))


def _first_instability(jacobian, scale: float) -> float | None:
    """The least step at which the round map has more eigenvalues outside the unit disc (not
    real and positive) than at the smallest step of the scan: a log-scan around ``scale``,
    then bisection; ``None`` when the scan finds none."""
    steps = [scale * 2.0**k for k in _SCAN]
    base = _count_unstable(jacobian(steps[0]))
    low = steps[0]
    for lr in steps[1:]:
        if _count_unstable(jacobian(lr)) > base:
            high = lr
            break
        low = lr
    else:
        return None
    for _ in range(_BISECT):
        mid = math.sqrt(low * high)
        if _count_unstable(jacobian(mid)) > base:
            high = mid
        else:
            low = mid
    return low


def _power_radius(solver, problem, state, iterations: int = 30) -> float:
    """rho(D), D = dJ/dgamma of one round, by power iteration on Jacobian-vector products (for
    a state too large to form J)."""
    flat, mask = _float_part(state)
    leaves, treedef = jax.tree.flatten(state)
    unravel = ravel_pytree([a for a, m in zip(leaves, mask, strict=True) if m])[1]

    def advance(v, lr):
        it = iter(unravel(v))
        s = treedef.unflatten([next(it) if m else a for a, m in zip(leaves, mask, strict=True)])
        return _float_part(_with_lr(solver, lr).round(problem, s))[0]

    @jax.jit
    def d_times(v):
        _, a = jax.jvp(lambda u: advance(u, 2.0), (flat,), (v,))
        _, b = jax.jvp(lambda u: advance(u, 1.0), (flat,), (v,))
        return a - b

    v = jax.random.normal(jax.random.key(0), flat.shape, flat.dtype)
    v = v / jnp.linalg.norm(v)
    norm = 1.0
    for _ in range(iterations):
        w = d_times(v)
        norm = float(jnp.linalg.norm(w))
        if not norm > 0:
            return 1.0
        v = w / norm
    return norm


# ---- Theorem 3.1's inner steps -------------------------------------------------------------
def inner_contraction(step: float, mu: float, smooth: float) -> float:
    """rho of one gradient step of size ``step`` on a ``mu``-strongly convex, ``smooth``-smooth
    function, for squared distances: 1 - step mu when step <= 1 / smooth (the proof of
    Theorem 3.1, eqs. (17) and (19)), else the exact worst case of a quadratic,
    max(|1 - step mu|, |1 - step smooth|)^2."""
    if step * smooth <= 1.0:
        return 1.0 - step * mu
    return max(abs(1.0 - step * mu), abs(1.0 - step * smooth)) ** 2


def penalty_inner_steps(lam_last: float, rho: float, c: float = 1.0) -> int:
    """Theorem 3.1's K: the least K >= max{1 - ln 2 / ln rho, ln(lam_T^2 / c) / ln(1 / rho)}
    (so that 2 rho^K <= rho and lam_T^2 rho^K <= c)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(
            f"inner_steps='auto' needs inner steps that contract (rho = {rho:.3g}); give smaller "
            "lr_inner / lr_lagrangian or inner_steps as an int."
        )
    if rho == 0.0:  # one step lands on the minimiser (step 1/L with mu = L): K = 1 holds both
        return 1
    log_rho = math.log(rho)
    k = max(1.0 - math.log(2.0) / log_rho, math.log(lam_last**2 / c) / -log_rho)
    return max(1, math.ceil(k - 1e-9))


def unrolled_inner_steps(horizon: int, rho: float) -> int:
    """The least K with T rho^K <= 1 (T = ``horizon``): K = O(log T) unrolled inner steps per
    round, so that the squared truncation error of an iterative-differentiation
    hypergradient, which shrinks like rho^K, sums to O(1) over the horizon (OBBO's
    O(T log T) gradient calls in Table 1 of Jia & Chen, arXiv:2602.11665)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(
            f"inner_steps='auto' needs inner steps that contract (rho = {rho:.3g}); give a "
            "smaller lr_inner or inner_steps as an int."
        )
    if rho == 0.0:  # exact after one step: T rho^K = 0 <= 1 at K = 1
        return 1
    return max(1, math.ceil(math.log(max(horizon, 2)) / -math.log(rho) - 1e-9))
