"""``"auto"`` inner steps that follow the run: rescaled as the inner curvature L_g changes.

``lr_inner="auto"`` (and the Neumann / adjoint / fixed-point steps derived from it) is fixed by
:meth:`bilevel.solvers.base.Solver.resolve` from the curvature at ``(x0, y0)``: ``c / L_g`` with
the paper's constant c. When L_g grows with x (a per-feature ridge penalty ``exp(x_j) w_j^2``
has ``L_g ~ 2 exp(max_j x_j)``), that step becomes unstable once x has moved, and the run
diverges for that reason alone. When L_g falls (a penalty ``exp(x) -> 0``), the step stays
stable but a single-loop method's one inner step per outer step contracts its inner iterates
by only ``1 - mu_g / L_g(x0)``: they lag ``y*(x)``, x overshoots, and the run drifts or
diverges late. So ``bl.solve`` and ``bl.sweep`` re-estimate L_g at the iterates every
``bilevel.drivers.engine.ADAPT_EVERY`` (25) steps and at every evaluation (between compiled
pieces, so nothing is recompiled: the steps are numeric leaves of the solver) and multiply
every ``"auto"`` inner step by ``r = L_g(x0, y0) / L_g(x_k, y_k)`` (the largest L_g over the
seeds) where ``r < 1``, and by the largest whole power of :data:`RISE` = 4 not above r where
``r >= 1``: the rule ``c / L_g`` evaluated where the run is, rising in coarse steps so that
the noise of an estimate at a minibatch run's iterates (x 2.4 between consecutive estimates of
STABLE's on the wine hyper-cleaning of ``benchmarks/defaults.py``) does not move it. Steps the
user gave as numbers are left alone, and so is ``lr_outer``. Measured on the logistic
regression there (``exp(x) -> 0.0025``, L_g from 3.64 to 0.149): SOBA with ``lr_outer = 1``
reached 0.02 of its start's ``||grad F||``, drifted and diverged at step 2100 with the start's
step, and ends at 2e-17 with the rising one.

A start can be far flatter than where the first steps go: a softmax regression from zero
weights has the Hessian ``(1/K)(I - 11^T/K) (x) xx^T`` there, 1/K of its largest, and one step
on the 300-digit hyper-cleaning of docs/step_sizes.md raised the batches' L_g 2.4x (1.35 to
3.18). A step sized at the start is then unstable before the first re-estimate: SBFW's 50-term
Neumann series with minibatches of 32 ran to 1e12 within 100 steps. So before the run, the
steps are scaled as a re-estimate would scale them at one plain inner step ahead, ``y0 -
grad_y g(x0, y0) / L_g(x0, y0)``, where L_g there exceeds the start's by more than
:data:`AHEAD_MARGIN` (:meth:`InnerCurvature.at_start`; offline only).

A falling step shortens what a truncated method sees: ITD's N unrolled steps, stocBiO's
Neumann series of degree Q and PZOBO's N-step paths leave a truncation bias ``(1 - lr
mu_g)^N`` that grows as ``lr`` falls with N fixed. So where a solver's count was ``"auto"``
(``Solver.auto_counts``) and its steps follow, the count is multiplied by the factor the steps
fell by, rounded down to a power of 2 and at most :data:`COUNT_GROWTH` = 8 (its cost grows with
it; :func:`count_growth`): ``N lr`` stays within 2x of its start. A count is static, so each
new one compiles the step once more (at most four: 1, 2, 4, 8). Measured (3000 steps, the
defaults benchmark's ``ridge_raw``, where L_g rises 36x along the path and ``L_g / mu_g``
reaches 1850; ``||grad F||`` at the end over the start's): ITD 0.152 -> 0.006 (full batch)
and 0.165 -> 0.022 (batches of 32), stocBiO 0.115 -> 0.052 (full), PZOBO and HOZOG 0.091 ->
0.013 (full) and 0.103 -> 0.059 (32).

L_g is estimated by :data:`POWER_STEPS` power iterations on Hessian-vector products of g in y
(a fixed pseudo-random start) on the inner data, or on a fixed random subset of
:data:`MAX_ROWS` rows of it; the same estimator at the start and along the run, so its bias
cancels in the ratio. The rescaling is a deterministic function of the state at an evaluation,
so a run resumed from a checkpoint rescales exactly as the uninterrupted one did. (The power
iteration is the one ``bilevel.analysis.metrics.reference_hypergradient`` writes inline for its
1/L step.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.analysis.diagnose import covering_batches
from bilevel.core import oracles
from bilevel.core.compiler import jit_options
from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_norm, tree_scale, tree_vdot
from bilevel.solvers.base import Solver

__all__ = [
    "InnerCurvature",
    "OnlineInnerCurvature",
    "followed_fields",
    "POWER_STEPS",
    "RISE",
    "MAX_ROWS",
    "AHEAD_MARGIN",
    "COUNT_GROWTH",
    "count_growth",
]

#: the steps rise by whole powers of this factor only (:class:`InnerCurvature`)
RISE = 4.0
#: power iterations per estimate of L_g
POWER_STEPS = 20
#: the estimate uses at most this many rows of the inner data (a fixed random subset)
MAX_ROWS = 4096
#: :meth:`InnerCurvature.at_start` scales the steps down only where L_g one step ahead exceeds
#: the start's by more than this factor (a few per cent is the estimates' own spread)
AHEAD_MARGIN = 1.1
#: the ``"auto"`` truncation counts grow by at most this factor (:func:`count_growth`): their
#: cost grows with them
COUNT_GROWTH = 8


def followed_fields(template: Solver, resolved: Solver) -> list[str]:
    """The inner step sizes that were ``"auto"`` in ``template`` and are numbers once
    ``resolved`` (``lr_*`` and ``*_lr`` fields other than ``lr_outer``), and, where there are
    such steps, the truncation counts that were ``"auto"`` (``auto_counts``: they follow the
    steps, :func:`count_growth`)."""
    out = []
    for fld in dataclasses.fields(template):
        name = fld.name
        if name == "lr_outer" or not (name.startswith("lr_") or name.endswith("_lr")):
            continue
        before, after = getattr(template, name), getattr(resolved, name)
        if _is_auto(before) and isinstance(after, int | float):
            out.append(name)
    if out:
        out += [name for name in type(template).auto_counts if _is_auto(getattr(template, name))]
    return out


def count_growth(scale) -> int:
    """The factor on the ``"auto"`` truncation counts for the steps' ``scale`` (the smallest
    over a sweep's points: a count is static, one for all of them): ``1 / scale`` where the
    steps fell, rounded down to a power of 2, at most :data:`COUNT_GROWTH`; 1 where they did not
    fall. The truncation bias of N steps of ``lr`` decays as ``(1 - lr mu_g)^N`` (ITD, the
    Neumann series, the zeroth-order paths), so N lr held fixed keeps it where it was."""
    smallest = float(np.min(scale))
    if not smallest < 1.0:  # also a nan scale: nothing to follow
        return 1
    return int(min(COUNT_GROWTH, 2.0 ** math.floor(math.log2(1.0 / smallest) + 1e-9)))


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


class InnerCurvature:
    """Rescales a solver's ``"auto"`` inner steps by ``L_g(start) / L_g(now)`` (at most
    :attr:`most` times their start value).

    With minibatches, L_g is the largest over batches of ``batch_size`` rows that cover the
    (subset of the) inner data, the curvature a step on one minibatch must respect; the full
    data's can fall far below it where a few rows keep their weight (STABLE with
    ``lr_outer=10`` on the wine hyper-cleaning of ``benchmarks/defaults.py``, batches of 32:
    the full data's estimate fell from 0.73 to 0.039 within 50 steps, the batches' from 0.93
    to no lower than 0.38, and the steps the full data's gave ran STABLE to a worse F).

    Args:
        resolved: the resolved solver (its ``"auto"`` steps are the values at the start).
        fields: the fields to rescale (:func:`followed_fields`).
        problem: the problem (as placed for the run).
        start: the run's initial states (leading seed axis), where L_g(start) is taken.
    """

    #: the largest factor on the start's steps: none offline (module docstring)
    most = math.inf

    def __init__(
        self, resolved: Solver, fields: list[str], problem: BilevelProblem, start, grid=False
    ):
        batch = resolved.curvature_batch(problem)
        batched = isinstance(batch, int) and problem.inner_data is not None
        self._estimate = _estimator(problem.inner, grid, batched)
        self._rows = self._data = _subset(problem.inner_data)
        if batched:  # the minibatches' curvature, which the steps of such a run must respect
            self._data = covering_batches(self._data, batch, jax.random.PRNGKey(0))
        self._step_ahead = _stepper(problem.inner, grid)
        self._follow(resolved, fields, problem, start)
        self.scale = 1.0 if not grid else np.ones_like(self.start)

    def at_start(self, problem: BilevelProblem, solver: Solver, state) -> Solver:
        """``solver`` with its followed steps scaled down where L_g one plain inner step
        ``y0 - grad_y g(x0, y0) / L_g(x0, y0)`` away is larger than at ``(x0, y0)``: a start
        can be far flatter than where the first steps go (a softmax regression from zero
        weights, whose Hessian is ``1/K`` of its largest there; module docstring), and a step
        sized for it is unstable there well before the first re-estimate, ADAPT_EVERY steps
        on. The scale is the one a re-estimate at that point would set, so later re-estimates
        continue the same rule."""
        x, y = solver.output(state)
        step = 1.0 / np.where(self.start > 0, self.start, np.inf)
        ahead = self._step_ahead(x, y, self._rows, np.asarray(step, dtype=float))
        ahead_L = self._largest_at(x, ahead)
        now = np.where(ahead_L > AHEAD_MARGIN * self.start, ahead_L, self.start)
        return self(problem, solver, None, now=now)

    def _follow(self, resolved: Solver, fields: list[str], problem, start) -> None:
        """The followed fields, their values at the start, and L_g there."""
        counts = type(resolved).auto_counts
        self.fields = [name for name in fields if name not in counts]
        self.base = {name: _number(getattr(resolved, name)) for name in self.fields}
        self.counts = {name: getattr(resolved, name) for name in fields if name in counts}
        self.start = self.largest(problem, resolved, start)

    def largest(self, problem: BilevelProblem, solver: Solver, state):
        """The largest estimate of L_g over the seeds of ``state`` (per grid point in a
        sweep, whose state has a leading axis of points)."""
        return self._largest_at(*solver.output(state))

    def _largest_at(self, x, y):
        values = np.asarray(self._estimate(x, y, self._data))
        return np.max(np.where(np.isfinite(values), values, 0.0), axis=-1)

    def __call__(self, problem: BilevelProblem, solver: Solver, state, now=None) -> Solver:
        """``solver`` with its followed steps rescaled for ``state`` (or for the curvature
        ``now`` where it is given)."""
        if now is None:
            now = self.largest(problem, solver, state)
        ok = (now > 0) & (self.start > 0)
        ratio = np.where(ok, np.minimum(self.most, self.start / np.where(ok, now, 1.0)), 1.0)
        # a rise in whole powers of RISE: the estimates' noise does not move a rising step
        rise = RISE ** np.floor(np.log(np.maximum(ratio, 1.0)) / np.log(RISE))
        scale = np.where(ratio < 1.0, ratio, rise)
        if np.array_equal(scale, self.scale):  # the usual case: nothing to rebuild
            return solver
        self.scale = scale
        if np.ndim(scale) == 0:  # Python floats keep the weak type of the user's numbers
            changes = {name: value * float(scale) for name, value in self.base.items()}
        else:
            changes = {name: jnp.asarray(value * scale) for name, value in self.base.items()}
        growth = count_growth(scale)
        changes.update({name: n * growth for name, n in self.counts.items()})
        return dataclasses.replace(solver, **changes)


class OnlineInnerCurvature(InnerCurvature):
    """:class:`InnerCurvature` for ``bl.solve_online``: L_g is that of the round the state is
    at, g_t on round t's evaluation data (``OnlineProblem.evaluation_data``), so the rule
    ``c / L_g`` of the ``"auto"`` inner steps (resolved on round 1) follows both x and the
    stream. Every :data:`bilevel.drivers.engine.ADAPT_EVERY` rounds, as offline.

    The steps only shrink here (:attr:`most` = 1), as they did offline before the rule
    followed falling curvature too: not yet measured on streams.

    Args:
        resolved, fields: as :class:`InnerCurvature`'s.
        problem: the online problem.
        start: the run's initial states (leading seed axis), at round 1.
    """

    most = 1.0

    def __init__(self, resolved: Solver, fields: list[str], problem, start):
        self._follow(resolved, fields, problem, start)
        self.scale = 1.0

    def largest(self, problem, solver: Solver, state):
        x, y = solver.output(state)
        t = jnp.minimum(state.t, problem.horizon)  # after the last round: the last round's
        values = np.asarray(_online_estimator()(problem, t, x, y))
        return np.max(np.where(np.isfinite(values), values, 0.0), axis=-1)


@functools.lru_cache(maxsize=1)
def _online_estimator():
    """The compiled estimate of L_g per seed of an online problem's round (built on first
    use; jit caches one program per problem structure, whose functions are static)."""
    return jax.jit(jax.vmap(_online_one, in_axes=(None, 0, 0, 0)), **jit_options())


def _online_one(problem, t, x, y) -> jax.Array:
    _, data = problem.evaluation_data(t)
    return _curvature(functools.partial(problem.inner, t), x, y, data)


def _number(value):
    """A step as a Python float, or a NumPy array of them (a sweep's stacked points)."""
    return float(value) if np.ndim(value) == 0 else np.asarray(value, dtype=float)


@functools.lru_cache(maxsize=32)
def _estimator(inner, grid: bool, batched: bool = False):
    """The compiled estimate of L_g per seed (and grid point) for the inner function ``inner``
    (cached, so repeated runs on one problem compile it once); ``batched``: the largest over
    the stacked batches the data is given as."""
    one = functools.partial(_curvature, inner)
    if batched:
        each = jax.vmap(one, in_axes=(None, None, 0))
        one = lambda x, y, batches: jnp.max(each(x, y, batches))  # noqa: E731
    fn = jax.vmap(one, in_axes=(0, 0, None))
    if grid:
        fn = jax.vmap(fn, in_axes=(0, 0, None))
    return jax.jit(fn, **jit_options())


@functools.lru_cache(maxsize=32)
def _stepper(inner, grid: bool):
    """The compiled plain inner step ``y - step grad_y g(x, y)`` per seed (and grid point, each
    with its own ``step``), for :meth:`InnerCurvature.at_start`."""

    def one(x, y, data, step):
        grad = oracles.grad_y(inner, x, y, data)
        return jax.tree.map(lambda a, d: a - jnp.asarray(step, a.dtype) * d, y, grad)

    fn = jax.vmap(one, in_axes=(0, 0, None, None))
    if grid:
        fn = jax.vmap(fn, in_axes=(0, 0, None, 0))
    return jax.jit(fn, **jit_options())


def _curvature(inner, x: Any, y: Any, data) -> jax.Array:
    """L_g at (x, y): the Rayleigh quotient after :data:`POWER_STEPS` power iterations."""

    def hvp(v):
        return oracles.hvp_yy(inner, x, y, data, v)

    leaves, treedef = jax.tree.flatten(y)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    noise = [jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves, strict=True)]
    v = jax.tree.unflatten(treedef, noise)

    def power(v, _):
        w = hvp(v)
        return tree_scale(1.0 / jnp.maximum(tree_norm(w), 1e-30), w), None

    v, _ = jax.lax.scan(power, v, None, length=POWER_STEPS)
    return tree_vdot(v, hvp(v)) / jnp.maximum(tree_vdot(v, v), 1e-30)


def _subset(data):
    """``data``, or a fixed random subset of :data:`MAX_ROWS` of its rows."""
    if data is None:
        return None
    n = jax.tree.leaves(data)[0].shape[0]
    if n <= MAX_ROWS:
        return data
    rows = jax.random.choice(jax.random.PRNGKey(0), n, (MAX_ROWS,), replace=False)
    return jax.tree.map(lambda a: jnp.take(a, rows, axis=0), data)
