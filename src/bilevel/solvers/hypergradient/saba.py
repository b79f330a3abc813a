r"""SABA: SOBA with SAGA variance reduction on all five sampled quantities (NeurIPS 2022).

Dagreou, Ablin, Vaiter, Moreau. "A framework for bilevel optimization that enables stochastic
and global variance reduction algorithms." NeurIPS 2022 (arXiv:2201.13409), Sec. 3 and
Theorems 2-3. SOBA's directions are sums over the samples of each level, so SAGA (Defazio,
Bach, Lacoste-Julien, NeurIPS 2014) applies to each term: keep, per sample, the last value
computed for it, and estimate the mean over the data by ``new_i - memory_i + mean(memory)``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import num_samples
from bilevel.core.tree import tree_axpy, tree_size, tree_sub
from bilevel.solvers.base import OuterState
from bilevel.solvers.hypergradient.soba import SOBA
from bilevel.solvers.registry import register

PyTree = Any

__all__ = ["SABA", "SABAState", "SAGAMemory"]


class SAGAMemory(NamedTuple):
    """The SAGA tables: row i holds the value of sample i's term at its last visit (leading
    axis = samples of that level); ``None`` for a level without data, whose terms are exact."""

    grad_y_g: PyTree  # (n_inner, *Y): grad_y g_i(x, y)
    hvp: PyTree  # (n_inner, *Y): d2g_i/dy2 (x, y) v
    cross: PyTree  # (n_inner, *X): d2g_i/dxdy (x, y) v
    grad_x_f: PyTree  # (n_outer, *X): grad_x f_j(x, y)
    grad_y_f: PyTree  # (n_outer, *Y): grad_y f_j(x, y)


class SABAState(NamedTuple):
    """SOBA's state plus the SAGA memory."""

    x: PyTree  # upper iterate x_k
    y: PyTree  # inner iterate, estimate of y*(x_k)
    v: PyTree  # adjoint iterate, estimate of [d2g/dy2]^{-1} grad_y f (library sign)
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state
    memory: SAGAMemory  # the per-sample tables of the five terms


def _inner_terms(problem: BilevelProblem, x, y, v):
    """``batch -> (grad_y g, d2g/dy2 v, d2g/dxdy v)`` on ``batch`` (SOBA's inner oracles)."""

    def terms(batch):
        return (
            oracles.grad_y(problem.inner, x, y, batch),
            oracles.hvp_yy(problem.inner, x, y, batch, v),
            oracles.cross_xy(problem.inner, x, y, batch, v),
        )

    return terms


def _outer_terms(problem: BilevelProblem, x, y):
    """``batch -> (grad_x f, grad_y f)``, one fused call."""
    return lambda batch: oracles.grads(problem.outer, x, y, batch)


def _per_sample(terms, batch):
    """``terms`` of every row of ``batch``, each row evaluated as a minibatch of size 1."""
    return jax.vmap(lambda row: terms(jax.tree.map(lambda a: a[None], row)))(batch)


def _saga(terms, batch, rows, table):
    """SAGA estimates of the data means of ``terms`` from the minibatch ``batch`` (data rows
    ``rows``), and the table with those rows overwritten by their new values.

    ``mean_b (new_b - table[rows_b]) + mean(table)``: unbiased for the mean over the data.
    A row drawn twice gets the same value twice (same sample, same point), so the scatter is
    well defined. ``rows`` None (a level without data): the terms are exact.
    """
    if rows is None:
        return terms(batch), table
    new = _per_sample(terms, batch)
    estimate = jax.tree.map(
        lambda n, t: jnp.mean(n - t[rows], axis=0) + jnp.mean(t, axis=0), new, table
    )
    return estimate, jax.tree.map(lambda t, n: t.at[rows].set(n), table, new)


def _zero_tables(terms, data):
    """Zero tables shaped like ``terms`` of every sample of ``data``."""
    shapes = jax.eval_shape(lambda d: _per_sample(terms, d), data)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


@register("saba")
@dataclasses.dataclass(frozen=True)
class SABA(SOBA):
    r"""SABA (Dagreou, Ablin, Vaiter, Moreau, NeurIPS 2022, Sec. 3; Theorems 2 and 3).

    SOBA's step (see :class:`~bilevel.solvers.hypergradient.soba.SOBA`: same sign convention,
    v ~ +[d2g/dy2]^{-1} grad_y f, the paper's v is its negative) with each of the five sampled
    quantities -- grad_y g_i, (d2g_i/dy2) v, (d2g_i/dxdy) v for the inner sample i, and
    grad_x f_j, grad_y f_j for the outer sample j, all at (x_k, y_k, v_k) -- replaced by its
    SAGA estimate ``S[q]_k = q_i(z_k) - w_i + 1/n sum_l w_l`` with memory w (one row per
    sample, then w_i <- q_i(z_k))::

        y_{k+1} = y_k - rho S[grad_y g]
        v_{k+1} = v_k - rho (S[d2g/dy2 v] - S[grad_y f])
        x_{k+1} = Proj_X(x_k - gamma (S[grad_x f] - S[d2g/dxdy v]))

    Indices are drawn uniformly with replacement (``bilevel.core.sampling``); with a minibatch the
    estimate averages ``q_b - w_b`` over its rows, and each row is evaluated as a batch of one.

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches; Sec. 2.2: one
    inner index i and one outer index j)::

        inner(0), inner_rows(0)   the three inner terms and the memory rows they overwrite
        outer(0), outer_rows(0)   the two partials of f and their memory rows

    Theorem 2: with constant steps rho, gamma ~ (n + m)^{-2/3},
    1/T sum_t E||grad h(x^t)||^2 = O((n + m)^{2/3} / T), the rate of full-batch gradient
    descent; Theorem 3: linear convergence under a Polyak-Lojasiewicz condition on h. So SABA
    runs constant steps only (``regime="constant"``; a schedule is still accepted).

    Memory initialisation (``init_memory``): "full" (default) fills the gradient tables with
    one pass over the data at (x_0, y_0), so mean(w) starts exact, as in SAGA's analysis; this
    pass (one full-data gradient of g and of f) is counted at step 0. The product tables start
    at 0, which is exact since v_0 = 0.
    "zero" starts every table at 0 (benchopt's default): the estimate stays unbiased (mean(w)
    is the mean of the table it corrects), but rows not yet visited bring no variance reduction.

    Memory cost: (n_inner (2 dim y + dim x) + n_outer (dim x + dim y)) floats; each step also
    averages the tables (O(n) work).

    Data: a level with finite-sum data needs minibatches (``batch_size``); a level without
    data (a deterministic problem) has exact terms -- SAGA over one "sample" that is the whole
    function is exact -- so on a deterministic problem SABA is SOBA with exact oracles.

    Checked against the paper (2026-11-27), on the same text as SOBA's (an anonymised version
    of arXiv:2201.13409: Sec. 2.2, eqs. (11a)-(11c), Theorems 3-4; neither the published
    version nor the appendix could be read):

    * samples and point: Sec. 2.2 draws two independent uniform indices i and j per iteration
      and sets w_i^{t+1} = w~_j^{t+1} = y^t = (z^t, x^t, v^t), so all five new terms are taken
      at the old iterates; S[phi, w]_i^t = phi_i(w_i^{t+1}) - phi_i(w_i^t) + 1/n sum phi(w^t),
      with the values phi_i(w_i^t) stored. Here the tables hold those values and ``_saga``
      forms new - table[rows] + mean(table) from the old table before writing the rows, on
      inner draw 0 and outer draw 0 of independent keys. Agrees.
    * signs: eqs. (11b)-(11c) add S[H v] + S[grad_1 F] and S[cross v] + S[grad_2 F] with the
      paper's v; with v = -v_paper (and so the product tables negated) they are the updates
      above, y and v sharing rho. Agrees.
    * steps: Theorems 3 (smooth, O(1/T)) and 4 (PL, linear) take fixed rho <= rho_* and
      gamma <= min(rho xi_*, 1/(8 L^h)); ``regimes`` is {"constant"}. Agrees.
    * memory init: the algorithm leaves it free; the remark after Theorem 4 starts every
      memory at the initial point (w_i^0 = w~_j^0 = w^0), which, with z^0 = z*(x^0) and
      v^0 = v*(x^0), cancels its constant C^0. "full" is that choice at (x_0, y_0, v_0 = 0);
      "zero" tables are not values at any memory point, a case the paper does not analyse.
    * minibatches: differs from the paper's remark in Sec. 2.2, which keeps one memory row per
      batch (n_b = ceil(n / b_in) rows, fixed batches); here one row per sample and batches of
      i.i.d. rows (the same estimator when the batch size is 1).
    * could not be verified: "Theorem 2" with steps ~ (n + m)^{-2/3} and "Theorem 3" above;
      the text read numbers them Theorems 3 and 4 and says that Theorem 3's proof has the
      outer step scale as (n + m)^{-1}.

    Args:
        lr_outer: gamma, or a schedule ``k -> step``.
        lr_inner: rho (y and v), or a schedule; "auto" (default) is 1/L_g from ``bl.diagnose``.
        batch_size: size of the inner and outer minibatches (64, benchopt's setting; unused on
            levels without data).
        regime: "constant" only (Theorem 2).
        k0: unused under "constant" (inherited from SOBA).
        init_memory: "full" or "zero" (see above).

    References:
        Dagreou, Ablin, Vaiter, Moreau. NeurIPS 2022 (arXiv:2201.13409). Defazio, Bach,
        Lacoste-Julien. "SAGA: A Fast Incremental Gradient Method With Support for Non-Strongly
        Convex Composite Objectives." NeurIPS 2014.
    """

    batch_size: int | None = 64
    init_memory: str = "full"

    name: ClassVar[str] = "saba"
    regimes: ClassVar[dict[str, tuple[float, float]]] = {"constant": (0.0, 0.0)}
    #: warn when the per-sample memory tables would hold more than this many bytes
    memory_warning_bytes: ClassVar[int] = 2**30
    chunked_batches: ClassVar[bool] = False  # its tables are read and written row by row

    def validate(self) -> None:
        super().validate()
        if self.init_memory not in ("full", "zero"):
            raise ValueError(
                f"SABA(init_memory={self.init_memory!r}) is unknown; use 'full' (one pass over "
                "the data at (x0, y0)) or 'zero'."
            )

    def check_problem(self, problem: BilevelProblem) -> None:
        super().check_problem(problem)
        if problem.stochastic and self.batch_size is None:
            raise ValueError(
                f"SABA(batch_size=None) on {problem.name}: SAGA keeps one memory row per sample "
                "and draws minibatches from the finite-sum data; give batch_size (e.g. 64), or "
                "use 'soba' for full-batch steps."
            )
        self._warn_about_table_memory(problem)

    def _warn_about_table_memory(self, problem: BilevelProblem) -> None:
        """SAGA's tables hold, per inner sample, grad_y g, the HVP and the cross product (dim y,
        dim y, dim x numbers) and per outer sample grad_x f and grad_y f: on data cleaning,
        where dim x is the number of samples, that is n^2 numbers (20,000 + 5,000 samples, dim y
        7,840: 3.2 GiB in float32, before the init pass's temporaries). Say so before the
        allocation fails."""
        dim_x, dim_y = tree_size(problem.x0), tree_size(problem.y0)
        itemsize = jnp.result_type(*jax.tree.leaves((problem.x0, problem.y0))).itemsize
        rows_in = num_samples(problem.inner_data) or 0
        rows_out = num_samples(problem.outer_data) or 0
        numbers = rows_in * (2 * dim_y + dim_x) + rows_out * (dim_x + dim_y)
        if numbers * itemsize > self.memory_warning_bytes:
            warnings.warn(
                f"SABA on {problem.name}: its per-sample memory tables take "
                f"{numbers * itemsize / 2**30:.1f} GiB ({rows_in} inner rows of "
                f"{2 * dim_y + dim_x} numbers, {rows_out} outer rows of {dim_x + dim_y}), and "
                "the init pass more (init_memory='zero' skips that pass); consider 'soba', "
                "which keeps no tables.",
                stacklevel=3,
            )

    def init(self, problem: BilevelProblem, key: jax.Array) -> SABAState:
        state = super().init(problem, key)  # SOBA's, v_0 = 0
        x, y, v, counts = state.x, state.y, state.v, state.counts
        full = self.init_memory == "full"
        inner, outer = (None, None, None), (None, None)
        if problem.inner_data is not None:
            inner = _zero_tables(_inner_terms(problem, x, y, v), problem.inner_data)
            if full:  # grad_y g_i at (x_0, y_0); the product rows stay 0, exact at v_0 = 0
                grad_y_g = _per_sample(
                    lambda batch: oracles.grad_y(problem.inner, x, y, batch), problem.inner_data
                )
                inner = (grad_y_g, *inner[1:])
                counts = counts.add(samples_inner=num_samples(problem.inner_data), grad_g=1)
        if problem.outer_data is not None:
            outer = _zero_tables(_outer_terms(problem, x, y), problem.outer_data)
            if full:
                outer = _per_sample(_outer_terms(problem, x, y), problem.outer_data)
                counts = counts.add(samples_outer=num_samples(problem.outer_data), grad_f=1)
        memory = SAGAMemory(*inner, *outer)
        return SABAState(*state[:5], counts, state.outer_state, memory)

    def step(self, problem: BilevelProblem, state: SABAState) -> SABAState:
        key, batch_key = jax.random.split(state.key)
        mb = self.minibatches(problem, batch_key, outer=1, inner=self.draws().inner)
        alpha, beta = self.step_sizes(state.k)
        x, y, v, mem = state.x, state.y, state.v, state.memory
        # SOBA's single inner sample i and outer sample j (draw 0 of each level), all at
        # (x_k, y_k, v_k); each term replaced by its SAGA estimate
        (grad_y_g, hvp, cross), inner_tables = _saga(
            _inner_terms(problem, x, y, v),
            mb.inner(0),
            mb.inner_rows(0),
            (mem.grad_y_g, mem.hvp, mem.cross),
        )
        (grad_x_f, grad_y_f), outer_tables = _saga(
            _outer_terms(problem, x, y), mb.outer(0), mb.outer_rows(0), mem[3:]
        )
        y_new = tree_axpy(-beta, grad_y_g, y)  # D_y
        v_new = self.adjoint().at_inner_step(beta).update(v, hvp, grad_y_f)  # D_v
        direction = tree_sub(grad_x_f, cross)  # D_x
        x_new, outer_state = self.outer_step(problem, x, direction, state.outer_state, alpha)
        counts = state.counts.add(**self.step_counts(problem, mb, 1))  # SOBA's calls
        memory = SAGAMemory(*inner_tables, *outer_tables)
        return SABAState(x_new, y_new, v_new, state.k + 1, key, counts, outer_state, memory)
