"""Diagnostics of the inner problem: strong convexity mu_g and smoothness L_g in y.

Every method in this library assumes ``g(x, .)`` is mu_g-strongly convex and L_g-smooth, and
most tie their inner step to ``1/L_g``. ``diagnose`` estimates both at ``(x0, y0)`` from the
extreme eigenvalues of the Hessian ``d^2 g / dy^2`` by the Lanczos method on Hessian-vector
products (Lanczos, 1950; with full reorthogonalisation, so it is exact once the Krylov space is
the whole space). For stochastic problems the HVP is averaged over the full data (or over
``num_batches`` minibatches of ``batch_size`` when the data is large). ``outer_smoothness``
does the same for the outer ``d^2 f / dy^2`` (L_f, for rules such as PZOBO's
``1 / max(L_f, L_g)``); ``diagnose`` does not compute it, so it stays one Lanczos run.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bilevel.core import oracles, sampling
from bilevel.core.problem import BilevelProblem

__all__ = [
    "Diagnosis",
    "diagnose",
    "outer_smoothness",
    "batch_smoothness",
    "covering_batches",
    "inner_smoothness",
    "NotStronglyConvexWarning",
]


class NotStronglyConvexWarning(UserWarning):
    """The inner problem does not look strongly convex in y at the starting point."""


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Estimated constants of the inner problem at ``(x0, y0)``."""

    mu_g: float  # smallest eigenvalue of d^2 g / dy^2 (strong convexity)
    L_g: float  # largest eigenvalue (smoothness)
    lanczos_steps: int  # Krylov dimension used (== dim y means exact up to rounding)
    dim_y: int

    @property
    def condition_number(self) -> float:
        return self.L_g / self.mu_g if self.mu_g > 0 else float("inf")

    @property
    def strongly_convex(self) -> bool:
        return self.mu_g > 1e-10 * max(abs(self.L_g), 1e-30)


def _lanczos(matvec, start: np.ndarray, steps: int) -> np.ndarray:
    """Ritz values, ascending, one row per row of ``start`` (``(count, dim)``), after up to
    ``steps`` Lanczos steps with full reorthogonalisation; ``matvec`` maps ``(count, dim)`` to
    ``(count, dim)`` row by row (one operator per row). Stops once every row's Krylov space is
    exhausted; a row exhausted before the others goes on with zero vectors, which adds Ritz
    values 0 to it (below the top of a positive definite operator, so only its top is
    meaningful then)."""
    basis = [start / np.linalg.norm(start, axis=1, keepdims=True)]
    alphas, betas = [], []
    for j in range(steps):
        w = np.array(matvec(basis[j]), dtype=np.float64)  # a writable copy
        alpha = np.einsum("cd,cd->c", w, basis[j])
        alphas.append(alpha)
        w -= alpha[:, None] * basis[j] + (betas[-1][:, None] * basis[j - 1] if j else 0.0)
        for q in basis:  # full reorthogonalisation (the basis is small)
            w -= np.einsum("cd,cd->c", w, q)[:, None] * q
        beta = np.linalg.norm(w, axis=1)
        done = beta < 1e-12 * np.maximum(1.0, np.abs(alpha))
        if j == steps - 1 or done.all():
            break
        beta = np.where(done, 0.0, beta)
        betas.append(beta)
        basis.append(np.where(done[:, None], 0.0, w / np.where(done, 1.0, beta)[:, None]))
    diagonals = np.stack(alphas, axis=1)
    offs = np.stack(betas, axis=1) if betas else np.zeros((len(start), 0))
    return np.stack(
        [
            np.linalg.eigvalsh(np.diag(a) + np.diag(b, 1) + np.diag(b, -1))
            for a, b in zip(diagonals, offs, strict=True)
        ]
    )


def _lanczos_extremes(matvec, dim: int, steps: int, key) -> tuple[float, float, int]:
    """Extreme Ritz values of one operator after ``steps`` Lanczos steps (:func:`_lanczos`),
    and the steps taken."""
    start = np.array(jax.random.normal(key, (1, dim)), dtype=np.float64)
    ritz = _lanczos(lambda rows: np.asarray(matvec(rows[0]))[None], start, steps)[0]
    return float(ritz[0]), float(ritz[-1]), len(ritz)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def diagnose(
    problem: BilevelProblem,
    *,
    steps: int = 60,
    batch_size: int = 4096,
    num_batches: int = 8,
    seed: int = 0,
    warn: bool = True,
) -> Diagnosis:
    """Estimate mu_g and L_g of ``g(x0, .)`` at ``y0`` by Lanczos on Hessian-vector products.

    Args:
        problem: the bilevel problem.
        steps: Lanczos steps (capped at dim y; the estimate is exact at dim y). Extreme
            eigenvalues converge first, so 60 steps are usually plenty.
        batch_size, num_batches: for inner data with more than ``batch_size`` samples, the HVP
            is averaged over ``num_batches`` random minibatches of this size.
        seed: seed of the starting vector and the minibatches.
        warn: emit a :class:`NotStronglyConvexWarning` when mu_g <= 0 (relative to L_g).

    Returns:
        A :class:`Diagnosis`.
    """
    # A problem is immutable, so its diagnosis is cached: "auto" settings then cost one Lanczos
    # run per problem, and a second solve compiles nothing.
    settings = (steps, batch_size, num_batches, seed)
    cached = _CACHE.get(problem, {}).get(settings)
    if cached is not None:
        _maybe_warn(problem, cached, warn)
        return cached
    mu, L, k, dim = _hessian_yy_extremes(
        problem.inner, problem, problem.inner_data, problem.n_inner, *settings
    )
    diag = Diagnosis(mu_g=mu, L_g=L, lanczos_steps=k, dim_y=dim)
    _CACHE.setdefault(problem, {})[settings] = diag
    _maybe_warn(problem, diag, warn)
    return diag


def outer_smoothness(
    problem: BilevelProblem,
    *,
    steps: int = 60,
    batch_size: int = 4096,
    num_batches: int = 8,
    seed: int = 0,
) -> float:
    """Estimate L_f, the smoothness of the outer ``f(x0, .)`` in y at ``y0``.

    The spectral norm of ``d^2 f / dy^2`` at ``(x0, y0)``, ``max(|lambda_min|, |lambda_max|)``
    (f may be nonconvex in y), by the same Lanczos machinery as :func:`diagnose` (same
    arguments, outer data averaged as ``diagnose`` averages the inner data; cached per
    problem). Like ``diagnose``'s L_g it is a local estimate restricted to y, so a lower bound
    on a smoothness constant in ``(x, y)`` such as Assumption A3 of Sow, Ji, Liang (NeurIPS
    2022).
    """
    settings = ("outer", steps, batch_size, num_batches, seed)
    cached = _CACHE.get(problem, {}).get(settings)
    if cached is None:
        lo, hi, _, _ = _hessian_yy_extremes(
            problem.outer, problem, problem.outer_data, problem.n_outer, *settings[1:]
        )
        cached = max(abs(lo), abs(hi))
        _CACHE.setdefault(problem, {})[settings] = cached
    return cached


#: the rows :func:`batch_smoothness` covers (all of them up to this many; a random subset of
#: this many beyond), and the Lanczos steps per minibatch (the largest eigenvalue converges
#: first; exact for dim y <= 30)
BATCH_COVER_ROWS, BATCH_LANCZOS_STEPS = 4096, 30
#: minibatches drawn as a run draws them (rows with replacement) beside the covering ones
BATCH_DRAWS = 8


def batch_smoothness(problem: BilevelProblem, batch_size: int, *, seed: int = 0) -> float:
    """The largest ``lambda_max(d^2 g/dy^2 (x0, y0; B))`` over minibatches B of ``batch_size``
    inner rows: :data:`BATCH_DRAWS` drawn as the solvers draw theirs (uniform, with
    replacement, so a row may come twice), and batches that together cover every row (a random
    permutation cut into consecutive batches, the last one topped up from the first rows;
    over at most :data:`BATCH_COVER_ROWS` rows, a random subset of that many beyond).

    Why: a step on a minibatch's gradient or Hessian-vector product (``y - alpha grad_y g(x, y;
    B)``, an adjoint or Neumann recursion ``w - eta (H_B w - b)``) is stable only below
    ``2 / lambda_max(H_B)``, and with fewer rows than the dimension of y a minibatch's Hessian
    is far more curved than the full data's (measured on a hyper-cleaning of 300 digits, y of
    64 x 10, batches of 32: 0.42-1.21 against 0.40), so ``"auto"`` steps set from the full
    data's L_g diverged there (IBCG's adjoint ran to 1e45 at 2/(mu_g + L_g) of the full
    data). The batches cover the rows because one row can decide it: standardised digits
    have a pixel that is nonzero in one image only, whose row has ``||a||^2 = 2142`` against
    a median of 45, and every batch holding it has curvature 3.36 against 1.51 for the others;
    8 random batches missed it on one seed of two, and SBFW's 50-term Neumann series on that
    row's batches at ``1/1.51`` ran to 1e18 in the first step. (A run draws rows with
    replacement, so a batch may hold such a row twice; the ``"auto"`` steps' factor ``c``,
    1 for most methods, leaves room for that.) Cached per problem and batch size; Lanczos as
    in :func:`diagnose`, :data:`BATCH_LANCZOS_STEPS` steps per batch, so the cost is about
    that many Hessian-vector products on the covered rows.
    """
    settings = ("batch", batch_size, seed)
    cached = _CACHE.get(problem, {}).get(settings)
    if cached is None:
        key = jax.random.PRNGKey(seed)
        # the draws of a run (rows with replacement: a row may come twice) and the cover
        mb = sampling.minibatches(
            key, None, problem.inner_data, batch_size, outer=0, inner=BATCH_DRAWS
        )
        drawn = jax.tree.map(lambda *b: jnp.stack(b), *[mb.inner(i) for i in range(BATCH_DRAWS)])
        cover = covering_batches(problem.inner_data, batch_size, key)
        batches = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), drawn, cover)
        cached = max(_batch_tops(problem, batches, BATCH_LANCZOS_STEPS, key))
        _CACHE.setdefault(problem, {})[settings] = float(cached)
    return float(cached)


def covering_batches(data, batch_size: int, key):
    """``data``'s rows as stacked batches (leading axes: batch, row) of ``batch_size`` rows that
    cover every row of a random permutation of at most :data:`BATCH_COVER_ROWS` of them (the
    last batch topped up from the permutation's first rows)."""
    n = sampling.num_samples(data)
    order = np.asarray(jax.random.permutation(key, n))[: min(n, BATCH_COVER_ROWS)]
    count = -(-len(order) // batch_size)
    rows = order[np.arange(count * batch_size) % len(order)].reshape(count, batch_size)
    return jax.tree.map(lambda leaf: jnp.asarray(leaf)[rows], data)


def _batch_tops(problem: BilevelProblem, batches, steps: int, key) -> np.ndarray:
    """The largest eigenvalue of ``d^2 g/dy^2 (x0, y0; B)`` for each of the stacked
    ``batches``: :func:`_lanczos` on all of them at once, one vmapped Hessian-vector product per
    step."""
    x, y = problem.x0, problem.y0
    flat_y, unravel = ravel_pytree(y)
    dim = int(flat_y.size)
    count = sampling.num_samples(batches)

    @jax.jit  # x, y and the data as arguments: XLA would otherwise constant-fold them
    def hvps(vs, x, y, batches):
        def one(v, batch):
            tangent = unravel(v.astype(flat_y.dtype))
            return ravel_pytree(oracles.hvp_yy(problem.inner, x, y, batch, tangent))[0]

        return jax.vmap(one)(vs, batches)

    v = np.array(jax.random.normal(key, (dim,)), dtype=np.float64)
    ritz = _lanczos(
        lambda rows: hvps(jnp.asarray(rows), x, y, batches),
        np.tile(v, (count, 1)),
        min(steps, dim),
    )
    return ritz[:, -1]


def inner_smoothness(problem: BilevelProblem, batch_size: int | None = None) -> float:
    """L_g for an ``"auto"`` step: :func:`diagnose`'s (the full data's, at (x0, y0)), or with
    ``batch_size`` (a run that draws minibatches) the larger of it and
    :func:`batch_smoothness`."""
    L = float(diagnose(problem).L_g)
    if batch_size is None or not problem.stochastic:
        return L
    return max(L, batch_smoothness(problem, batch_size))


def _hessian_yy_extremes(fn, problem, data, n, steps, batch_size, num_batches, seed):
    """``(lambda_min, lambda_max, lanczos steps, dim y)`` of ``d^2 fn / dy^2`` at (x0, y0):
    Lanczos on HVPs averaged over ``data`` (over ``num_batches`` minibatches of ``batch_size``
    when it holds more than ``batch_size`` samples)."""
    key = jax.random.PRNGKey(seed)
    if n is not None and n > batch_size:
        mb = sampling.minibatches(key, None, data, batch_size, outer=0, inner=num_batches)
        batches = [mb.inner(i) for i in range(num_batches)]
    else:
        batches = [data]
    return _extremes_on(fn, problem, batches, steps, key)


def _extremes_on(fn, problem, batches, steps, key) -> tuple[float, float, int, int]:
    """``(lambda_min, lambda_max, lanczos steps, dim y)`` of the mean over ``batches`` (a list
    of equal shapes: one compiled HVP serves them all) of ``d^2 fn / dy^2`` at (x0, y0)."""
    x, y = problem.x0, problem.y0
    flat_y, unravel = ravel_pytree(y)
    dim = int(flat_y.size)

    # x, y and the data are arguments, not closed-over constants: XLA would otherwise
    # constant-fold the whole model (minutes for a CNN).
    @jax.jit
    def hvp(v, x, y, batches):
        tangent = unravel(v.astype(flat_y.dtype))
        total = sum(ravel_pytree(oracles.hvp_yy(fn, x, y, b, tangent))[0] for b in batches)
        return total / len(batches)

    lo, hi, k = _lanczos_extremes(
        lambda v: hvp(jnp.asarray(v), x, y, batches), dim, min(steps, dim), key
    )
    return lo, hi, k, dim


def _maybe_warn(problem: BilevelProblem, diag: Diagnosis, warn: bool) -> None:
    mu, L = diag.mu_g, diag.L_g
    if warn and not diag.strongly_convex:
        warnings.warn(
            f"the inner problem of {problem.name} is not strongly convex in y at (x0, y0): the "
            f"smallest eigenvalue of d^2 g/dy^2 is about {mu:.3g} (largest {L:.3g}). Every "
            "method in bilevel assumes a strongly convex inner problem; add a ridge term "
            "(+ c/2 ||y||^2) to g or reparametrise y.",
            NotStronglyConvexWarning,
            stacklevel=3,
        )


def auto_inner_step(
    problem: BilevelProblem, factor: float = 1.0, batch_size: int | None = None
) -> float:
    """``factor / L_g`` at the starting point (the ``lr_inner="auto"`` rule); with
    ``batch_size``, L_g is the minibatches' (:func:`inner_smoothness`)."""
    L_g = inner_smoothness(problem, batch_size)
    if not L_g > 0:
        raise ValueError(
            f"lr_inner='auto' needs a positive inner smoothness constant; estimated L_g = "
            f"{L_g:.3g} at (x0, y0). Give lr_inner explicitly."
        )
    return float(factor / L_g)


def strong_convexity(
    problem: BilevelProblem, needs: str, instead: str, batch_size: int | None = None
) -> tuple[float, float]:
    """``(mu_g, L_g)`` estimated at (x0, y0), for an ``"auto"`` setting that is built from them
    (IBCG's 2/(mu_g + L_g), SBFW's a_0, TTSA's L_g/mu_g Neumann length).

    Args:
        problem: the problem to diagnose (cached per problem by :func:`diagnose`).
        needs: what needs the constants, the start of the error message.
        instead: what the user can give instead, the end of the error message.
        batch_size: for a run that draws minibatches: L_g is then the larger of the full data's
            and the minibatches' (:func:`inner_smoothness`); mu_g is the full data's.

    Raises:
        ValueError: when the estimate is not strongly convex (mu_g <= 1e-10 L_g, or L_g < mu_g).
    """
    d = diagnose(problem)
    # relative to L_g, as the warning judges it: a rounding-sized mu_g is no strong convexity
    if not (d.strongly_convex and d.L_g >= d.mu_g):
        raise ValueError(
            f"{needs}, but bl.diagnose estimated mu_g = {d.mu_g:.3g}, L_g = {d.L_g:.3g} at "
            f"(x0, y0): g is not strongly convex there; {instead}."
        )
    return float(d.mu_g), inner_smoothness(problem, batch_size)
