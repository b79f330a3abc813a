r"""PZOBO: Hessian-free bilevel optimization by differencing two inner paths, and the machinery
PZOBO-S (``pzobo_s.py``) and HOZOG (``hozog.py``) share.

Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms." NeurIPS 2022
(arXiv:2110.07004), Algorithm 1 (PZOBO) and Algorithm 2 (PZOBO-S, Appendix A).

The response Jacobian ``J_N(x) = d y^N(x) / dx`` of N inner gradient steps from a fixed y_0 is
estimated by differencing two inner paths, one started at x and one at ``x + mu u`` (eq. 4)::

    delta(x; u) = (y^N(x + mu u) - y^N(x)) / mu,      Jhat_N(x; u)^T v = <delta(x; u), v> u,

so the d x p matrix is never formed. The hypergradient (eq. 5; eq. 7 with minibatches) is

    gradhat Phi(x) = grad_x f(x, y^N) + (1/Q) sum_j <delta(x; u_j), grad_y f(x, y^N)> u_j,

with both partial gradients of f at the *unperturbed* pair (x, y^N(x)). Only first-order
gradients of g in y are used: no Hessian- or Jacobian-vector products, no backpropagation through
the inner loop, and no inner path is stored (every path runs inside a ``lax.scan`` that carries
only its current iterate): beyond the Q directions (Q p numbers), the paths take O((Q + 1) d)
memory when run in parallel (``parallel_directions=True``) or O(2 d) one after the other.

What the estimator estimates. With Gaussian u, E_u[<delta, v> u] = grad_x <y^N_mu(x), v>, the
gradient of the Gaussian smoothing of x -> <y^N(x), v> (Lemma 3). When y^N is affine in x (the
quadratic test problem, also with minibatches shared by both paths) this is *exactly*
``J_N^T v`` for every mu: the N-step path Jacobian, not ``J_* = dy*/dx``; the two differ by
``-A^{-1} (I - alpha A)^N B`` on the quadratic. The single-direction error has covariance
``||a||^2 I + a a^T`` (a = J_N^T v), so E||<delta, v> u - a||^2 = (p + 1) ||a||^2 for Gaussian u
(Isserlis), divided by Q for Q directions: the p/Q term of Proposition 2.

The library's two names differ only in their defaults: "pzobo" is Algorithm 1 (full batches,
``lr_inner="auto"`` = 1/L as in Theorem 1), "pzobo-s" is Algorithm 2 (minibatches of 256 as in
Appendix B.3, ``lr_inner="auto"`` = 2/(L + mu_g) as in Theorem 2), with the theorems'
L = max(L_f, L_g) (:func:`auto_smoothness`). With minibatches both draw
ONE inner minibatch per inner step and feed it to all Q + 1 paths (Algorithm 2's common random
numbers, Sec. 2.3: "all SGD runs follow the same batch sampling path"), and one outer minibatch
D_F drawn independently of the inner ones (Algorithm 2, line 13). ``shared_batches=False`` gives
every path its own draws, an ablation of ours: delta then carries noise of order sigma / mu.

Deviations of the official code (``github.com/sowmaster/esjacobians``) are options, all off by
default:

* ``directions``: "gaussian" (the paper: u ~ N(0, I_p) over all of x), "sphere_scaled" (u uniform
  on the unit sphere of R^p and the estimate multiplied by p: unbiased for the sphere-smoothed
  Jacobian, single-direction error (p - 1) ||a||^2), "sphere_unscaled_per_tensor" (the code:
  every leaf of x normalised to unit norm separately, no rescaling, so E[u u^T] =
  blockdiag(I_{p_i} / p_i) and the indirect term is shrunk by 1/p_i per leaf).
* ``inner_optimizer``: "gd" (the paper), "momentum" (heavy ball ``v <- 0.9 v + grad;
  y <- y - lr v``, PyTorch's SGD convention; the code's meta-learning and 20 Newsgroups runs),
  "adam" (PyTorch defaults; the code's MNIST run), or any ``optax.GradientTransformation``
  without a learning rate (``optax.trace(decay=0.5)``, ``optax.scale_by_adam(b1=0.5)``): the
  same dialect as ``outer_optimizer``. Every path starts with a fresh, identical optimiser state.
* ``warm_start``: start both paths from the previous unperturbed y^N instead of y_0 (the code's
  MNIST run); the first iteration starts from y_0.
* ``outer_optimizer`` (inherited from :class:`bilevel.solvers.Solver`): "sgd" (Algorithm 1's
  x <- x - beta gradhat), "momentum" or "adam" (every experiment of the paper), or an optax
  transformation.

The two paths must start from the same point and see the same randomness (Algorithm 2, lines 3
and 6: one y_0 and one batch S_{t-1} for every path), or the difference of the start or of the
noise, divided by mu, swamps the estimate; with ``warm_start`` they still do, since both start
from the same previous y^N.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from bilevel.analysis.diagnose import inner_smoothness, outer_smoothness
from bilevel.core import oracles
from bilevel.core.problem import BilevelProblem
from bilevel.core.schedules import step_size
from bilevel.core.tree import tree_axpy, tree_sub, tree_vdot
from bilevel.solvers.base import (
    IterateState,
    Solver,
    _is_auto,
    check_optimizer,
    optimizer_transform,
)
from bilevel.solvers.registry import register

PyTree = Any

__all__ = [
    "DIRECTIONS",
    "INNER_OPTIMIZERS",
    "sample_directions",
    "combine_directions",
    "auto_smoothness",
    "auto_directions",
    "AUTO_DIRECTIONS_MAX",
    "PathDifferenceState",
    "PathDifferenceSolver",
    "PZOBO",
]

#: Direction distributions (see :func:`sample_directions`) and the names of the inner update
#: rules (``inner_optimizer`` also takes any optax.GradientTransformation without a learning rate).
DIRECTIONS = ("gaussian", "sphere_scaled", "sphere_unscaled_per_tensor")
INNER_OPTIMIZERS = ("gd", "momentum", "adam")
#: the most directions ``num_directions="auto"`` draws (:func:`auto_directions`)
AUTO_DIRECTIONS_MAX = 16


def sample_directions(key: jax.Array, x: PyTree, num: int, mode: str) -> tuple[PyTree, float]:
    """``num`` random directions shaped like ``x`` (leading axis ``num``) and the scale c.

    One draw ``z = jax.random.normal(key, (num, p))`` over the flattened x (``ravel_pytree``
    order) underlies every mode, so array and pytree versions of a problem get the same
    directions:

    * "gaussian": u = z, c = 1 (eq. 4).
    * "sphere_scaled": u = z / ||z||, c = p (sphere smoothing; unbiased for the smoothed
      Jacobian).
    * "sphere_unscaled_per_tensor": each leaf of z normalised separately, c = 1 (official code).

    The estimate uses ``c * <delta, v> * u``; the perturbed point is ``x + mu * u``.
    """
    flat, unravel = ravel_pytree(x)
    p = flat.size
    z = jax.random.normal(key, (num, p), dtype=flat.dtype)
    if mode == "gaussian":
        scale = 1.0
    elif mode == "sphere_scaled":
        z = z / jnp.linalg.norm(z, axis=1, keepdims=True)
        scale = float(p)
    elif mode == "sphere_unscaled_per_tensor":
        scale = 1.0
    else:
        raise ValueError(f"unknown direction distribution {mode!r}; use one of {DIRECTIONS}.")
    u = jax.vmap(unravel)(z)
    if mode == "sphere_unscaled_per_tensor":
        u = jax.tree.map(_unit_rows, u)
    return u, scale


def combine_directions(coeffs: jax.Array, u: PyTree, scale) -> PyTree:
    """``(c / Q) sum_j coeffs_j u_j``: the estimate's indirect term (eq. 5 / eq. 7), shaped
    like one direction; Q is ``len(coeffs)``, ``u`` has the directions on its leading axis."""
    weights = (scale / coeffs.shape[0]) * coeffs
    return jax.tree.map(lambda leaf: jnp.tensordot(weights, leaf, axes=1), u)


def auto_smoothness(problem: BilevelProblem, batch_size: int | None = None) -> float:
    """L = max(L_f, L_g), the constant of Theorems 1-2's inner step (alpha <= 1/L and
    alpha = 2/(L + mu_g)).

    The paper's L_f and L_g are Lipschitz constants of grad f and grad g in w = (x, y)
    (Assumptions 2-3; ``L = max{L_f, L_g}`` in Proposition 1 and Theorems 1-2). Both are
    estimated here as the library estimates L_g for every "auto" rule, by Lanczos on the
    y-Hessians at (x0, y0): ``bl.diagnose``'s L_g of g and
    :func:`~bilevel.analysis.diagnose.outer_smoothness`'s L_f of f (the spectral norm of
    d^2 f/dy^2). These are local, y-restricted estimates, so lower
    bounds on the paper's constants. With ``batch_size`` (a run that draws minibatches) L_g is
    the minibatches' where larger (:func:`~bilevel.analysis.diagnose.inner_smoothness`).
    Raises ValueError if L is not positive.
    """
    L = max(inner_smoothness(problem, batch_size), outer_smoothness(problem))
    if not L > 0:
        raise ValueError(
            f"lr_inner='auto' needs a positive smoothness constant; estimated L = max(L_f, L_g) "
            f"= {L:.3g} at (x0, y0). Give lr_inner explicitly."
        )
    return float(L)


def auto_directions(dim: int) -> int:
    """``num_directions="auto"``: Q = p + 1 for an x of p <= 15 numbers, else 1 (the paper's).

    With Gaussian directions the estimate's indirect term has error
    ``E||<delta, v> u - a||^2 = (p + 1) ||a||^2 / Q`` (module docstring; the p/Q term of
    Proposition 2), so Q = p + 1 directions bring it to ``||a||^2``, the size of the term
    itself, for Q + 1 paths a step (run side by side with ``parallel_directions``). Where that
    takes more than :data:`AUTO_DIRECTIONS_MAX` paths no affordable Q does it, and the
    paper's Q = 1 ("fixed to 1 in all our experiments", Appendix B) is kept.

    Measured on a diabetes ridge regression with ten per-feature penalties and minibatches of 32
    (3000 steps, ``lr_outer="auto"``): HOZOG ends at ``||grad F||`` 0.039 of its start on
    average over six seeds (at most 0.061) with Q = 11, 0.077 (at most 0.108) with Q = 1, and
    PZOBO within 0.001 of it on every seed; PZOBO-S at 0.033 over three seeds (at most 0.041)
    against 0.082 (at most 0.109); the tuned step is 3.16 with Q = 11, 1 with Q = 1. On a wine
    hyper-cleaning (x of 106 numbers) more directions were not better: the tuning took larger
    steps that ended noisier (PZOBO with minibatches of 32, three seeds: mean 0.032 with Q = 1,
    0.043 with 4, 0.085 with 16).
    """
    return dim + 1 if dim + 1 <= AUTO_DIRECTIONS_MAX else 1


def _unit_rows(leaf: jax.Array) -> jax.Array:
    """Each ``leaf[i]`` divided by its Euclidean norm (i runs over the directions)."""
    norms = jnp.linalg.norm(leaf.reshape(leaf.shape[0], -1), axis=1)
    return leaf / norms.reshape((-1,) + (1,) * (leaf.ndim - 1))


def _drop_axis(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda a: a[0], tree)


def _add_axis(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda a: a[None], tree)


#: PZOBO's state is the shared single-iterate state: y is the unperturbed inner output
#: y_k^N = y^N(x_k) (the next warm start, if enabled)
PathDifferenceState = IterateState


@dataclasses.dataclass(frozen=True)
class PathDifferenceSolver(Solver):
    """Shared machinery of PZOBO, PZOBO-S and HOZOG: N-step inner paths at x and at x + mu u_j.

    Subclasses say what each perturbed path contributes (:meth:`_coefficient`) and what is
    computed at the unperturbed point (:meth:`_unperturbed`). The hypergradient estimate is
    ``direct + (c / Q) sum_j coefficient_j u_j``.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int | str = "auto"
    num_directions: int | str = "auto"
    smoothing: float = 0.01
    directions: str = "gaussian"
    warm_start: bool = True
    inner_optimizer: Any = "gd"
    shared_batches: bool = True
    parallel_directions: bool = True

    name: ClassVar[str] = "path-difference"
    auto_in_step: ClassVar[tuple[str, ...]] = ("num_directions",)  # from x's size, static
    auto_counts: ClassVar[dict[str, int]] = {"inner_steps": 20}

    def validate(self) -> None:
        cls = type(self).__name__
        q = self.num_directions
        if not _is_auto(q) and (isinstance(q, bool) or not isinstance(q, int) or q < 1):
            raise ValueError(
                f"{cls}(num_directions=...) must be a positive int or 'auto', got {q!r}."
            )
        mu = self.smoothing
        if isinstance(mu, bool) or not (isinstance(mu, int | float) and 0 < mu < float("inf")):
            raise ValueError(
                f"{cls}(smoothing=...) must be a positive finite float (the paper uses 0.1 or "
                f"0.01), got {self.smoothing!r}."
            )
        self._check_choices(directions=DIRECTIONS)
        check_optimizer(cls, "inner_optimizer", self.inner_optimizer, INNER_OPTIMIZERS)
        for fld in ("warm_start", "shared_batches", "parallel_directions"):
            if not isinstance(getattr(self, fld), bool):
                raise ValueError(f"{cls}({fld}=...) must be True or False.")

    # ---- bookkeeping -----------------------------------------------------------------------
    def with_directions(self, problem: BilevelProblem) -> PathDifferenceSolver:
        """This solver with ``num_directions="auto"`` set for the size of ``problem``'s x
        (:func:`auto_directions`; part of :meth:`resolve`)."""
        if not _is_auto(self.num_directions):
            return self
        dim = ravel_pytree(problem.x0)[0].size
        return dataclasses.replace(self, num_directions=auto_directions(dim))

    def resolve(self, problem: BilevelProblem) -> PathDifferenceSolver:
        """``num_directions="auto"`` (:meth:`with_directions`), then :meth:`Solver.resolve`."""
        return Solver.resolve(self.with_directions(problem), problem)

    @property
    def inner_draws(self) -> int:
        """Inner minibatch draws per step: N shared by all paths, or N per path."""
        paths = 1 if self.shared_batches else self.num_directions + 1
        return paths * self.inner_steps

    def _draw_offset(self, path):
        """First inner draw of path ``path`` (0 = unperturbed, j = 1..Q perturbed)."""
        return 0 if self.shared_batches else path * self.inner_steps

    def init(self, problem: BilevelProblem, key: jax.Array) -> PathDifferenceState:
        return self.initial_state(problem, key)

    def _inner_transform(self) -> optax.GradientTransformation:
        """The inner optimiser without its learning rate (the path multiplies by lr): the
        outer optimiser's table (:func:`bilevel.solvers.base.optimizer_transform`), so "momentum"
        is PyTorch's SGD momentum v <- 0.9 v + grad and "adam" PyTorch's Adam
        m_hat / (sqrt(v_hat) + eps) with betas (0.9, 0.999), eps 1e-8."""
        return optimizer_transform(self.inner_optimizer)

    # ---- one inner path --------------------------------------------------------------------
    def _inner_step(self, problem: BilevelProblem, transform, x, y, opt, batch, lr):
        """One step of the inner optimiser on g(x, .) at y on ``batch``: ``(y, opt)``."""
        direction, opt = transform.update(oracles.grad_y(problem.inner, x, y, batch), opt)
        return tree_axpy(-lr, direction, y), opt

    def inner_path(self, problem: BilevelProblem, mb, x, y, lr, path) -> PyTree:
        """N steps of the inner optimiser on g(x, .) from y; step t uses inner draw
        ``offset(path) + t``. A ``lax.scan`` carrying only (y, optimiser state): no path stored.
        """
        offset, transform = self._draw_offset(path), self._inner_transform()

        def body(carry, t):
            batch = mb.inner(offset + t)
            return self._inner_step(problem, transform, x, *carry, batch, lr), None

        opt0 = transform.init(y)  # fresh and identical for every path (module docstring)
        (y, _), _ = jax.lax.scan(body, (y, opt0), jnp.arange(self.inner_steps))
        return y

    def joint_paths(self, problem: BilevelProblem, mb, x, x_pert, y, lr) -> tuple[PyTree, PyTree]:
        """The unperturbed path at x and the Q perturbed ones at ``x_pert`` (leading axis Q) in
        ONE scan, ``(y^N, Y^N)``: inner step t draws minibatch t once and every path takes its
        step on it (Algorithm 2's shared S_{t-1}). The iterates are those of :meth:`inner_path`
        run per path, which would draw (slice or gather) the same batch Q + 1 times; only for
        ``shared_batches`` with ``parallel_directions``, where all Q + 1 paths are in memory
        anyway."""
        transform = self._inner_transform()

        def advance(x_, y_, opt, batch):
            return self._inner_step(problem, transform, x_, y_, opt, batch, lr)

        # Q = 1 (the paper's setting) runs its one perturbed path without vmap: a product
        # vmapped over a batch of 1 is a batched product to XLA:CPU, which runs it through Eigen
        # at about 1.5x the time of the plain product, and the plain one shares its minibatch
        # operand with the unperturbed path's (bilevel.drivers._xla_cpu.dot_merge). PZOBO on
        # data cleaning: 1.06 -> 0.89 of its oracle floor (docs/performance.md).
        single = self.num_directions == 1
        advance_perturbed = advance if single else jax.vmap(advance, in_axes=(0, 0, 0, None))
        x_paths = _drop_axis(x_pert) if single else x_pert

        def body(carry, t):
            here, perturbed = carry
            batch = mb.inner(t)
            here = advance(x, *here, batch)
            perturbed = advance_perturbed(x_paths, *perturbed, batch)
            return (here, perturbed), None

        start = (y, transform.init(y))  # fresh and identical for every path (module docstring)
        copies = start
        if not single:
            copies = jax.tree.map(
                lambda a: jnp.broadcast_to(a, (self.num_directions, *a.shape)), start
            )
        ((y_n, _), (y_pert, _)), _ = jax.lax.scan(
            body, (start, copies), jnp.arange(self.inner_steps)
        )
        return y_n, (_add_axis(y_pert) if single else y_pert)

    # ---- what subclasses define ------------------------------------------------------------
    def _unperturbed(self, problem, batch_f, x, y_n):
        """(direct term of the estimate, context passed to every ``_coefficient``)."""
        raise NotImplementedError

    def _coefficient(self, problem, batch_f, x_pert, y_pert, y_n, context):
        """The scalar multiplying ``c u_j / Q`` for the path at x_pert ending at y_pert."""
        raise NotImplementedError

    def _oracle_counts(self) -> dict:
        """Calls of f per step (g's are (Q + 1) N gradients for every method here)."""
        raise NotImplementedError

    # ---- the estimator ---------------------------------------------------------------------
    def coefficients(self, problem: BilevelProblem, mb, x, y_init, lr, u):
        """Run the unperturbed path and the Q perturbed ones; return ``(coeffs, direct, y^N)``.

        ``u`` holds the directions (leading axis Q). ``coeffs[j]`` is the scalar of direction j
        before the scale c and the 1/Q average, e.g. ``<delta_j, grad_y f(x, y^N)>`` for PZOBO.
        Every path starts from the same ``y_init`` (Algorithm 1, line 3; Algorithm 2, line 3).
        """
        batch_f = mb.outer(0)  # D_F: one outer draw, independent of the inner draws
        if self.shared_batches and self.parallel_directions:
            x_pert = jax.vmap(lambda u_j: tree_axpy(self.smoothing, u_j, x))(u)
            y_n, y_pert = self.joint_paths(problem, mb, x, x_pert, y_init, lr)
            direct, context = self._unperturbed(problem, batch_f, x, y_n)

            def coefficient(x_j, y_j):
                return self._coefficient(problem, batch_f, x_j, y_j, y_n, context)

            return jax.vmap(coefficient)(x_pert, y_pert), direct, y_n

        y_n = self.inner_path(problem, mb, x, y_init, lr, 0)
        direct, context = self._unperturbed(problem, batch_f, x, y_n)

        def one(u_j, path):  # path j = 1..Q, at x + mu u_j
            x_j = tree_axpy(self.smoothing, u_j, x)
            y_j = self.inner_path(problem, mb, x_j, y_init, lr, path)
            return self._coefficient(problem, batch_f, x_j, y_j, y_n, context)

        paths = jnp.arange(1, self.num_directions + 1)
        # The unperturbed path runs on its own: vmapping it together with the perturbed ones
        # was measured 2.5x slower on CPU (batched dots instead of matrix-vector products).
        if self.parallel_directions:  # memory O(Q d)
            coeffs = jax.vmap(one)(u, paths)
        else:  # one path after another: memory O(d) beyond the directions
            coeffs = jax.lax.map(lambda args: one(*args), (u, paths))
        return coeffs, direct, y_n

    def hypergradient(self, problem: BilevelProblem, mb, x, y_init, lr, u, scale):
        """``direct + (c / Q) sum_j coeffs_j u_j`` (eq. 5 / eq. 7) and y^N."""
        coeffs, direct, y_n = self.coefficients(problem, mb, x, y_init, lr, u)
        return jax.tree.map(jnp.add, direct, combine_directions(coeffs, u, scale)), y_n

    # ---- the step ----------------------------------------------------------------------------
    def step(self, problem: BilevelProblem, state: PathDifferenceState) -> PathDifferenceState:
        if _is_auto(self.num_directions):  # Q from x's size: static, as resolve sets it
            return self.with_directions(problem).step(problem, state)
        x, k = state.x, state.k
        # Key convention (tests rebuild the draws from it): split the state key into
        # (next key, minibatch key, direction key).
        key, batch_key, dir_key = jax.random.split(state.key, 3)
        mb = self.minibatches(problem, batch_key, outer=1, inner=self.inner_draws)
        u, scale = sample_directions(dir_key, x, self.num_directions, self.directions)
        y_init = state.y if self.warm_start else problem.y0  # Alg. 1 line 3: y_k^0 = y_0
        lr_inner = step_size(self.lr_inner, k)
        hypergrad, y_n = self.hypergradient(problem, mb, x, y_init, lr_inner, u, scale)

        # Alg. 1 line 15: x_{k+1} = x_k - beta gradhat (or the outer optimiser's step)
        lr_outer = step_size(self.lr_outer, k)
        x_new, outer_state = self.outer_step(problem, x, hypergrad, state.outer_state, lr_outer)

        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_g=(self.num_directions + 1) * self.inner_steps,
            **self._oracle_counts(),
        )
        return PathDifferenceState(
            x=x_new, y=y_n, k=k + 1, key=key, counts=counts, outer_state=outer_state
        )


@register("pzobo")
@dataclasses.dataclass(frozen=True)
class PZOBO(PathDifferenceSolver):
    r"""PZOBO (Sow, Ji, Liang, NeurIPS 2022, Algorithm 1).

    Per outer iteration k::

        y^N   = N inner GD steps on g(x_k, .) from y_0                     (lines 3-6)
        for j = 1..Q:  u_j ~ N(0, I_p)
                       Y_j^N = N inner GD steps on g(x_k + mu u_j, .) from y_0  (lines 7-11)
                       delta_j = (Y_j^N - y^N) / mu                          (line 12, eq. 4)
        gradhat = grad_x f(x_k, y^N) + (1/Q) sum_j <delta_j, grad_y f(x_k, y^N)> u_j  (l. 14, eq. 5)
        x_{k+1} = x_k - beta gradhat                                         (line 15)

    Draws of one step with ``batch_size`` (``inner(i)``, ``outer(i)`` of the step's
    minibatches; third key of the step's split)::

        inner(t), t < N   inner step t of ALL Q + 1 paths (Algorithm 2, lines 3-6: one S_{t-1}
                          for every path); ``shared_batches=False``: inner(jN + t) for path j
                          (0 = unperturbed), an ablation
        outer(0)          D_F, drawn independently of the inner draws (Algorithm 2, line 13):
                          both partials of f at (x_k, y^N)
        third key         the directions u_1..u_Q

    Args:
        lr_outer: beta, float or schedule (Theorem 1: beta = 1/(L_Phi sqrt K); the experiments
            use Adam, see ``outer_optimizer``). Default ``"auto"``: tuned by ``bl.solve`` on
            the problem (``bilevel.drivers.tuning``).
        lr_inner: alpha, float or schedule; "auto" (default) is 1/L with L = max(L_f, L_g)
            (Theorem 1: alpha <= 1/L), both estimated at (x0, y0) (:func:`auto_smoothness`).
        batch_size: None (default, Algorithm 1's full gradients) or a minibatch size, then one
            inner minibatch per inner step shared by all paths (as Algorithm 2).
        inner_steps: N. Both the response Jacobian of the two paths and y^N are truncated
            after N steps of alpha (their bias decays as (1 - alpha mu_g)^N), so N must grow as
            alpha falls: ``"auto"`` (default) starts at 20 (Appendix B.2, linear
            hyper-representation), and where ``bl.solve`` lowers the ``"auto"`` alpha as L_g
            rises it multiplies N by the same factor (in powers of 2, at most 8:
            :mod:`bilevel.drivers.curvature`). A number is kept as given.
        num_directions: Q. ``"auto"`` (default): p + 1 for an x of p <= 15 numbers, where the
            Gaussian estimate's error ``(p + 1) ||a||^2 / Q`` (Proposition 2's p/Q term) then
            falls to the size of the term itself, else the paper's 1 ("fixed to 1 in all our
            experiments", Appendix B; Theorems 1-2 take Q = O(1)); :func:`auto_directions`
            has the rule and its measurement. The reproductions pass the paper's 1.
        smoothing: mu (default 0.01: Appendix B.2 linear HR and C; "0.1 or 0.01").
        directions: "gaussian" (default, eq. 4), "sphere_scaled", "sphere_unscaled_per_tensor"
            (official code); see the module docstring.
        warm_start: start both paths from the previous y^N (the official code's MNIST run)
            instead of Algorithm 1's fixed y_0. Default on: with a fixed y_0, N inner steps
            leave y^N short of y*(x) wherever g(x, .) is ill-conditioned, and that bias, not the
            step, decides where the run ends (measured: an L2-penalised logistic regression
            whose penalty exp(x) tends to 0.005 ends at ||grad F|| 0.16 of its start with y_0
            and 0.06 warm). The reproductions pass it as their paper ran it.
        inner_optimizer: the inner update rule of every path, in ``outer_optimizer``'s
            dialect: "gd" (default, Algorithm 1), "momentum" (heavy ball with coefficient 0.9,
            PyTorch's convention, as in the code and Appendix C; ``optax.trace(decay=0.9)``),
            "adam" (PyTorch's defaults: betas (0.9, 0.999), eps 1e-8;
            ``optax.scale_by_adam()``), or any ``optax.GradientTransformation`` WITHOUT a
            learning rate, e.g. ``optax.trace(decay=0.5)`` or ``optax.scale_by_adam(b1=0.5)``;
            the path multiplies its update by ``lr_inner``. A transformation is static (part of
            the compiled program): reuse one object to reuse the compilation.
        outer_optimizer: "sgd" (default, Algorithm 1), "momentum" or "adam" (every experiment;
            optax's Adam with its defaults, the same as PyTorch's), or an optax transformation.
        shared_batches: one inner draw per inner step for all paths (default, Algorithm 2);
            False gives every path its own draws (ablation; delta noise ~ sigma/mu).
        parallel_directions: run the Q perturbed paths with ``vmap`` (memory O(Q d)) or one
            after another with ``lax.map`` (memory O(d)).

    References:
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (arXiv:2110.07004).

    Assumptions: g(x, .) strongly convex and smooth, grad g Lipschitz, f smooth and Lipschitz
    (A1-A3 of the paper).
    """

    name: ClassVar[str] = "pzobo"
    paper: ClassVar[str] = (
        "Sow, Ji, Liang. On the Convergence Theory for Hessian-Free Bilevel Algorithms. "
        "NeurIPS 2022, Algorithm 1."
    )
    auto_inner_factor: ClassVar[float] = 1.0  # Theorem 1: alpha <= 1/L

    def resolve(self, problem: BilevelProblem) -> PZOBO:
        """``lr_inner="auto"`` = 1/L, L = max(L_f, L_g) (Theorem 1, :func:`auto_smoothness`);
        ``num_directions="auto"`` (:meth:`with_directions`)."""
        solver = self.with_directions(problem).with_counts()
        if not _is_auto(solver.lr_inner):
            return solver
        step = self.auto_inner_factor / auto_smoothness(problem, self.curvature_batch(problem))
        return dataclasses.replace(solver, lr_inner=float(step))

    def _unperturbed(self, problem, batch_f, x, y_n):
        # eq. (5)/(7): both partials at the unperturbed (x_k, y^N), y^N held fixed
        grad_x_f, grad_y_f = oracles.grads(problem.outer, x, y_n, batch_f)
        return grad_x_f, grad_y_f

    def _coefficient(self, problem, batch_f, x_pert, y_pert, y_n, grad_y_f):
        delta = jax.tree.map(lambda a: a / self.smoothing, tree_sub(y_pert, y_n))  # eq. (4)
        return tree_vdot(delta, grad_y_f)

    def _oracle_counts(self) -> dict:
        return {"grad_f": 1}
