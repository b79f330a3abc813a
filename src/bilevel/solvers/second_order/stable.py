r"""STABLE: single-timescale stochastic bilevel optimization (Algorithm 1, eqs. (8)-(9)).

Chen, Sun, Xiao, Yin. "A Single-Timescale Method for Stochastic Bilevel Optimization."
AISTATS 2022 (arXiv:2102.04671).

STABLE keeps recursive (STORM-style) estimates of the two dense second-order matrices of the
lower level, the cross Jacobian H_xy ~ d^2 g/dx dy (dim x by dim y) and the Hessian
H_yy ~ d^2 g/dy^2, and uses them twice: in the x-direction (the implicit hypergradient (5) at
the current y) and in a y-step that *predicts* the motion of y*(x) along the x-step,
y*(x^{k+1}) - y*(x^k) ~ -H_yy^{-1} H_xy^T (x^{k+1} - x^k). That correction is what lets x and
y use step sizes of the same order (Lemma 3). The matrices are materialised, so the method
costs O(dim y^2) memory and O(dim y^3) dense algebra per step (Table 1: the projection of the
Hessian estimate, an eigendecomposition where its floor binds and Cholesky factorisations
otherwise, ``second_order/eigen_floor.py``): it is meant for small lower levels (the paper's
experiments have dim y = 14, 22 and 54).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.schedules import step_size
from bilevel.solvers.base import OuterState, Solver, _is_auto
from bilevel.solvers.registry import register
from bilevel.solvers.second_order.eigen_floor import (
    floor_and_factor,
    floor_eigenvalues,
    smallest_eigenvalue,
    solve_with_factor,
    symmetrize,
)

PyTree = Any

__all__ = [
    "STABLE",
    "STABLEState",
    "DenseHessianWarning",
    "clip_frobenius",
    "floor_eigenvalues",
    "STABLE_REGIMES",
    "DENSE_DIM_LIMIT",
]

#: dim(y) above which ``STABLE.check_problem`` warns about the dense matrices.
DENSE_DIM_LIMIT = 2000

#: Step-size orders. "constant": alpha, beta fixed (Theorem 2, nonconvex: all Theta(1/sqrt(K))
#: for a horizon K, so the user scales the constants with K); the default tau_k = (k+1)^(-1/2).
#: "strongly-convex": alpha_k, beta_k, tau_k all ~ 1/(k0 + k) (Theorem 3, eq. (30)).
STABLE_REGIMES = ("constant", "strongly-convex")


class DenseHessianWarning(UserWarning):
    """STABLE was given a lower level too large for dense Hessians."""


def clip_frobenius(matrix: jax.Array, radius: float | None) -> jax.Array:
    """``Pbar``: the projection onto the Frobenius ball ``{M : ||M||_F <= radius}`` (eq. (9a)).

    ``M min(1, radius / ||M||_F)``; ``radius=None`` is no projection (an infinite radius).
    """
    if radius is None:
        return matrix
    norm = jnp.linalg.norm(matrix)
    # double where: no 0/0 when M = 0 (then the scale is 1 anyway)
    safe = jnp.where(norm > radius, norm, 1.0)
    return jnp.where(norm > radius, matrix * (radius / safe), matrix)


class STABLEState(NamedTuple):
    x: PyTree  # upper iterate x^k
    y: PyTree  # lower iterate y^k, tracks y*(x^k)
    x_prev: PyTree  # x^{k-1}: where the STORM correction h^{k-1}(phi^k) is evaluated (x^0 at k=0)
    y_prev: PyTree  # y^{k-1} (y^0 at k = 0)
    H_xy: jax.Array  # H_xy^{k-1}: estimate of d^2 g/dx dy, (dim x, dim y), ||.||_F <= C_gxy
    H_yy: jax.Array  # H_yy^{k-1}: estimate of d^2 g/dy^2, (dim y, dim y), symmetric, >= mu_g I
    mu_g: jax.Array  # the floor of Punder that H_yy^{k-1} was projected with (see STABLE.mu_g)
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


@register("stable")
@dataclasses.dataclass(frozen=True)
class STABLE(Solver):
    r"""STABLE (Chen, Sun, Xiao, Yin, AISTATS 2022, Algorithm 1).

    Per iteration k, with ONE inner sample phi^k (used by every g-oracle of the step) and one
    outer sample xi^k (used by both f-gradients)::

        h^k(.) := d2g(x^k, y^k; phi^k),   h^{k-1}(.) := d2g(x^{k-1}, y^{k-1}; phi^k)
        H_xy^k  = Pbar  ((1 - tau_k)(H_xy^{k-1} - h_xy^{k-1}) + h_xy^k)                  (9a)
        H_yy^k  = Punder((1 - tau_k)(H_yy^{k-1} - h_yy^{k-1}) + h_yy^k)                  (9b)
        h_f     = grad_x f(x^k, y^k; xi^k) - H_xy^k (H_yy^k)^{-1} grad_y f(x^k, y^k; xi^k)
        x^{k+1} = P_X(x^k - alpha_k h_f)                                                 (8a)
        y^{k+1} = y^k - beta_k grad_y g(x^k, y^k; phi^k)
                      - (H_yy^k)^{-1} (H_xy^k)^T (x^{k+1} - x^k)                         (8b)

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches; Algorithm 1 draws
    the two data phi^k and xi^k per iteration)::

        inner(0)   phi^k: h_xy and h_yy at (x^{k-1}, y^{k-1}) AND at (x^k, y^k) (the STORM
                   correction differences one sample), and h_g^k of (8b) (eq. (6))
        outer(0)   xi^k: both partials of f

    Pbar is the Frobenius-ball projection of radius ``max_cross_norm`` (the paper's C_gxy) and
    Punder the eigenvalue floor at ``mu_g`` (Assumption 2's strong-convexity constant). The y-step
    uses the projected x-step (x first, Gauss-Seidel). On the deterministic quadratic with exact
    matrices the correction makes the y-error obey e_{k+1} = (I - beta_k A) e_k exactly.

    Choices the paper leaves open (Algorithm 1 gives no k = 0 rule; Sec. 4 no mu_g), made here:

    * k = 0: Algorithm 1 refers to the undefined (x^{-1}, y^{-1}); we take (x^{-1}, y^{-1}) :=
      (x^0, y^0) and tau_0 := 1, so H^0 = P(h^0(phi^0)): the first estimate is the first
      sample's matrix, with no extra samples and no initial H^0 to choose.
    * ``mu_g="auto"`` (a floor that follows the run). The paper treats mu_g as a known constant,
      a lower bound on the eigenvalues of d^2 g/dy^2 everywhere (Assumption 2), and reports no
      value. What the analysis uses of it is that the true Hessian at the iterate lies in the
      projection set, lambda_min(d^2 g(x^k, y^k)) >= mu_g, so that Punder does not move the
      estimate away from it and ||H_yy^{-1}|| <= 1/mu_g (eq. (60)). A floor taken once at
      (x0, y0) loses the first property when the run reaches a less convex region, and then
      biases H_yy (a floor above the true Hessian's eigenvalues moves the estimate away from
      it): on the stable-hpo runs x reached the box floor 1e-3, where g is
      only 2e-3-strongly convex, far below the start's floor, and some starts diverged
      (docs/reproduction.md, stable-hpo). So "auto" sets the floor of step k to half the
      smallest eigenvalue of the sampled Hessian h_yy^k = d^2 g(x^k, y^k; phi^k) that (9b)
      evaluates anyway (a tridiagonal reduction and bisection, no eigenvectors).
      lambda_min is concave, so E lambda_min(h_yy(phi)) <= lambda_min(E h_yy(phi)): the
      sample errs low on average, the safe side for a floor, and the factor 1/2 is a margin
      for the noise. A sample that is not positive definite (lambda_min <= 1e-10 ||h_yy||_F,
      e.g. minibatches of a problem whose per-sample Hessians are singular) keeps the previous
      floor; the floor before the first step is ``mu_g_init``, by default half
      ``bl.diagnose``'s full-data estimate at (x0, y0). A float ``mu_g`` is a fixed floor (the
      paper's reading).
    * ``max_cross_norm=None`` (no clip): C_gxy bounds E||d^2 g/dx dy(.; phi)||^2 (Assumption 3)
      and has no value in the paper, whose Remark says the projections are there for the
      analysis. Give a float to clip.
    * ``tau=None``: the paper's tau is its own sequence, and its value depends on the horizon K:
      Theorem 2 (nonconvex, eq. (28)) takes tau_k = 1/sqrt(K) with
      beta_k <= min(1/sqrt(K), ...) and alpha_k <= beta_k, so tau >= beta >= alpha, all of
      order 1/sqrt(K); Theorem 3 (strongly convex, eq. (30a)) takes beta_k = tau_k
      <= min((mu_g/L_g)/(32(mu_g + L_g)), 1/(K_0 + k)). A solver does not know K, so the
      default starts at tau_0 = 1 (the k = 0 convention above) and decays at the theorem's
      order, independently of the step sizes: tau_k = (k + 1)^(-1/2) under "constant" (at
      every k < K it is >= Theorem 2's 1/sqrt(K), which it reaches at the last step, so
      Lemma 4's drift term L^2 ||x^k - x^{k-1}||^2 / tau_k is never larger than with
      Theorem 2's tau, and its variance term, through sum_k alpha tau_k <= 2 alpha sqrt(K),
      at most twice as large), and tau_k = k0 / (k0 + k) under "strongly-convex" (Theorem 3's
      O(1/k)). Tying tau to beta instead (tau_k = min(beta_k, 1)) would switch the recursion
      off (tau = 1: H^k = P(h^k)) whenever lr_inner >= 1; Theorem 3's tau_k = beta_k is
      ``tau=lr_inner`` (a float <= 1) under "strongly-convex".
    * Step sizes: the paper's experiments (Sec. 4) follow each theorem's order and pick the
      constants from {1, 0.5, 0.1, 0.05, 0.01}; ``regime`` gives the order, ``lr_*`` the constant.

    Args:
        lr_outer: alpha, the x step (initial value under "strongly-convex"), or a schedule.
        lr_inner: beta, the y step, or a schedule; ``"auto"`` (default) is 1/L_g from
            ``bl.diagnose``. Theory: beta <= (mu_g/L_g)/(32(mu_g + L_g)) and alpha <= beta.
        batch_size: size of phi^k and xi^k (None = full data). The paper's Algorithm 1 draws one
            datum; a minibatch is averaged inside every oracle.
        tau: STORM weight tau_k in (0, 1] of (9): a float (fixed under "constant", the k = 0
            value under "strongly-convex"), a schedule, or None (default): (k + 1)^(-1/2) under
            "constant", k0 / (k0 + k) under "strongly-convex" (see above).
        mu_g: eigenvalue floor of H_yy: a float (> 0) is a fixed floor; "auto" (default)
            follows the run, half the smallest eigenvalue of each step's sampled Hessian (see
            above).
        mu_g_init: under ``mu_g="auto"``, the floor before the first step and while no sampled
            Hessian has been positive definite; None (default) is half ``bl.diagnose``'s
            lambda_min at (x0, y0), filled in by ``resolve``.
        max_cross_norm: C_gxy, the Frobenius radius of H_xy, or None (no clip).
        regime: "constant" (Theorem 2's constant steps) or "strongly-convex" (Theorem 3:
            alpha_k, beta_k, tau_k ~ k0 / (k0 + k), floats are the k = 0 values).
        k0: the offset K_0 of the strongly convex schedule (the paper: "sufficiently large").

    References:
        Chen, Sun, Xiao, Yin. "A Single-Timescale Method for Stochastic Bilevel Optimization."
        AISTATS 2022. Cutkosky & Orabona, "Momentum-based variance reduction in non-convex SGD"
        (STORM), NeurIPS 2019, for the recursive estimator.

    Assumptions: g(x, .) mu_g-strongly convex; f, g smooth with Lipschitz second derivatives
    (Assumptions 1-3); X closed convex; y unconstrained. Costs O(dim y^2) memory and
    O(dim y^3) dense algebra per step.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    tau: Any = None
    mu_g: Any = "auto"
    mu_g_init: float | None = None
    max_cross_norm: float | None = None
    regime: str = "constant"
    k0: float = 100.0

    name: ClassVar[str] = "stable"
    paper: ClassVar[str] = (
        "Chen, Sun, Xiao, Yin. A Single-Timescale Method for Stochastic Bilevel Optimization. "
        "AISTATS 2022, Algorithm 1."
    )
    #: ``mu_g="auto"``: this factor times lambda_min of each step's sampled Hessian (and of
    #: bl.diagnose's estimate at (x0, y0) for the default ``mu_g_init``)
    auto_mu_g_factor: ClassVar[float] = 0.5

    def validate(self) -> None:
        self._check_choices(regime=STABLE_REGIMES)
        if not (isinstance(self.k0, int | float) and self.k0 > 0):
            raise ValueError(f"STABLE(k0=...) must be > 0, got {self.k0!r}.")
        if isinstance(self.mu_g, str):
            if self.mu_g != "auto":
                raise ValueError(
                    f"STABLE(mu_g={self.mu_g!r}) must be a positive float (a fixed floor) or "
                    "'auto' (half the smallest eigenvalue of each step's sampled d^2 g/dy^2)."
                )
        elif isinstance(self.mu_g, bool) or not (
            isinstance(self.mu_g, int | float) and 0 < self.mu_g < float("inf")
        ):
            raise ValueError(
                f"STABLE(mu_g=...) must be a positive finite float (a lower bound on the "
                f"eigenvalues of d^2 g/dy^2) or 'auto', got {self.mu_g!r}."
            )
        init = self.mu_g_init
        if init is not None and (
            isinstance(init, bool)
            or not (isinstance(init, int | float) and 0 < init < float("inf"))
        ):
            raise ValueError(
                f"STABLE(mu_g_init=...) must be a positive finite float or None (half "
                f"bl.diagnose's lambda_min at (x0, y0)), got {init!r}."
            )
        if self.max_cross_norm is not None and not (
            isinstance(self.max_cross_norm, int | float) and self.max_cross_norm > 0
        ):
            raise ValueError(
                f"STABLE(max_cross_norm=...) must be > 0 or None (no clip), got "
                f"{self.max_cross_norm!r}."
            )
        if self.tau is not None and not callable(self.tau):
            if isinstance(self.tau, bool) or not (
                isinstance(self.tau, int | float) and 0 < self.tau <= 1
            ):
                raise ValueError(
                    f"STABLE(tau=...) must be in (0, 1], a schedule, or None ((k+1)^(-1/2) or "
                    f"k0/(k0+k) by regime), got {self.tau!r}."
                )

    def check_problem(self, problem: BilevelProblem) -> None:
        super().check_problem(problem)
        dim_y = int(ravel_pytree(problem.y0)[0].size)
        if dim_y > DENSE_DIM_LIMIT:
            dim_x = int(ravel_pytree(problem.x0)[0].size)
            warnings.warn(
                f"STABLE materialises dense matrices: dim(y) = {dim_y} means an inner Hessian "
                f"of {dim_y}x{dim_y} and a cross Jacobian of {dim_x}x{dim_y} (O(dim_y^2) "
                f"memory) and O(dim_y^3) dense algebra every step. For a lower level "
                f"this large use a Hessian-vector-product or first-order method such as "
                f"'stocbio', 'aid-cg', 'f2sa' or 'pzobo-s'.",
                DenseHessianWarning,
                stacklevel=2,
            )

    def resolve(self, problem: BilevelProblem) -> STABLE:
        solver = super().resolve(problem)
        if _is_auto(solver.mu_g) and solver.mu_g_init is None:
            from bilevel.analysis.diagnose import diagnose

            d = diagnose(problem, warn=False)
            if not d.strongly_convex:
                raise ValueError(
                    f"STABLE(mu_g='auto'): the inner problem does not look strongly convex at "
                    f"(x0, y0) (smallest Hessian eigenvalue ~ {d.mu_g:.3g}); STABLE needs a "
                    "positive floor: give mu_g (or mu_g_init) explicitly."
                )
            solver = dataclasses.replace(solver, mu_g_init=self.auto_mu_g_factor * d.mu_g)
        return solver

    def unresolved(self) -> list[str]:
        """``mu_g="auto"`` is a setting of the run (the floor follows it), not a placeholder:
        only its starting floor ``mu_g_init`` must be filled in by :meth:`resolve`."""
        names = super().unresolved()
        if "mu_g" in names and self.mu_g_init is not None:
            names.remove("mu_g")
        return names

    def outer_step_decays(self, problem: BilevelProblem) -> bool:
        """alpha_k ~ 1/(K_0 + k) in the ``"strongly-convex"`` regime (Theorem 3, eq. (30a))."""
        del problem
        return self.regime != "constant"

    def step_sizes(self, k) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(alpha_k, beta_k, tau_k)``: floats scaled by the regime's decay, schedules as given;
        ``tau=None`` is (k + 1)^(-1/2) ("constant") or k0 / (k0 + k) ("strongly-convex")."""
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        # Theorem 2 ("constant"): constant steps; Theorem 3, eq. (30a) ("strongly-convex"):
        # alpha_k, beta_k, tau_k ~ 1/(K_0 + k), i.e. order 1 of bilevel.core.schedules.step_size
        power = 0.0 if self.regime == "constant" else 1.0

        def rate(value):
            return step_size(value, kf, power, self.k0)

        if self.tau is None:  # the theorems' order of tau, from tau_0 = 1 (class docstring)
            # (k + 1)^(-1/2) is step_size(1.0, k, 0.5, 1.0) in exact arithmetic; it is kept in
            # this form so that its rounding (and the replica tests' numbers) do not move
            tau = (kf + 1.0) ** -0.5 if self.regime == "constant" else rate(1.0)
        else:
            tau = rate(self.tau)
        return rate(self.lr_outer), rate(self.lr_inner), jnp.minimum(tau, 1.0)

    def project_hessian(self, estimate: jax.Array, h_yy: jax.Array, previous: jax.Array):
        """Punder (9b) of ``estimate`` at this step's floor: ``(H_yy, its Cholesky factor,
        floor)`` (:func:`~bilevel.solvers.second_order.eigen_floor.floor_and_factor`: the
        eigendecomposition runs only on steps where the floor binds).

        The floor is the fixed ``mu_g``, or under ``"auto"`` half the smallest eigenvalue of the
        sampled Hessian ``h_yy`` (symmetrised), ``previous`` when that sample is not positive
        definite (lambda_min <= 1e-10 ||h_yy||_F); lambda_min comes from
        :func:`~bilevel.solvers.second_order.eigen_floor.smallest_eigenvalue`, not a full
        eigendecomposition.
        The test's scale is the Frobenius norm, within a factor sqrt(dim y) above |lambda_max|:
        the two scales disagree only on samples with condition numbers between 1e10 and
        sqrt(dim y) 1e10, singular at float32 precision, and the Frobenius norm saves the second
        bisection that lambda_max took (14 us at dim y 50, a tenth of STABLE's step).
        """
        if _is_auto(self.mu_g):
            sym = symmetrize(h_yy)
            low = smallest_eigenvalue(sym)
            scale = jnp.sqrt(jnp.sum(sym * sym))
            positive = low > 1e-10 * jnp.maximum(scale, 1e-30)
            floor = jnp.where(positive, self.auto_mu_g_factor * low, previous)
        else:  # a fixed floor (possibly traced: a pytree leaf)
            floor = jnp.full_like(previous, self.mu_g)
        floor = floor.astype(previous.dtype)
        H_yy, factor = floor_and_factor(symmetrize(estimate), floor)
        return H_yy, factor, floor

    def init(self, problem: BilevelProblem, key: jax.Array) -> STABLEState:
        flat_x, _ = ravel_pytree(problem.x0)
        flat_y, _ = ravel_pytree(problem.y0)
        dtype = jnp.result_type(flat_x.dtype, flat_y.dtype)
        dim_x, dim_y = flat_x.size, flat_y.size
        mu_g = self.mu_g_init if _is_auto(self.mu_g) else self.mu_g
        return STABLEState(
            x=problem.x0,
            y=problem.y0,
            x_prev=problem.x0,
            y_prev=problem.y0,
            # never used: tau_0 = 1 makes H^0 = P(h^0(phi^0)); kept feasible all the same
            H_xy=jnp.zeros((dim_x, dim_y), dtype),
            H_yy=mu_g * jnp.eye(dim_y, dtype=dtype),
            mu_g=jnp.asarray(mu_g, dtype),
            k=jnp.zeros((), jnp.int32),
            key=key,
            counts=Counts.zeros(),
            outer_state=self.outer_init(problem.x0),
        )

    def step(self, problem: BilevelProblem, state: STABLEState) -> STABLEState:
        f, g = problem.outer, problem.inner
        x, y, x_prev, y_prev = state.x, state.y, state.x_prev, state.y_prev
        flat_x, _ = ravel_pytree(x)
        flat_y, unravel_y = ravel_pytree(y)
        key, batch_key = jax.random.split(state.key)
        # Algorithm 1 draws two data per iteration: phi^k (inner) and xi^k (outer). Inner draw 0
        # is phi^k for BOTH Hessian evaluations of (9) and for h_g^k (eq. (6)): the same index
        # returns the same sample, which is what makes the STORM correction variance-reducing.
        mb = self.minibatches(problem, batch_key, outer=1, inner=1)
        phi, xi = mb.inner(0), mb.outer(0)
        alpha, beta, tau = self.step_sizes(state.k)
        tau = jnp.where(state.k == 0, 1.0, tau)  # k = 0: H^0 = P(h^0(phi^0)) (class docstring)

        # (9a): cross Jacobian estimate, d2g/dxdy is (dim x, dim y)
        h_xy_prev = oracles.jacobian_xy(g, x_prev, y_prev, phi)
        h_xy = oracles.jacobian_xy(g, x, y, phi)
        H_xy = clip_frobenius((1 - tau) * (state.H_xy - h_xy_prev) + h_xy, self.max_cross_norm)
        # (9b): inner Hessian estimate, floored at mu_g; its Cholesky factor serves both solves
        h_yy_prev = oracles.hessian_yy(g, x_prev, y_prev, phi)
        h_yy = oracles.hessian_yy(g, x, y, phi)
        estimate = (1 - tau) * (state.H_yy - h_yy_prev) + h_yy
        H_yy, factor, mu_g = self.project_hessian(estimate, h_yy, state.mu_g)

        def solve_yy(v):  # (H_yy^k)^{-1} v
            return solve_with_factor(factor, v)

        grad_x_f, grad_y_f = oracles.grads(f, x, y, xi)  # one xi^k for both
        h_g = oracles.grad_y(g, x, y, phi)  # eq. (6): the same phi^k

        # (8a): x^{k+1} = P_X(x^k - alpha_k h_f), h_f = grad_x f - H_xy H_yy^{-1} grad_y f
        flat_gx, unravel_x = ravel_pytree(grad_x_f)
        direction = unravel_x(flat_gx - H_xy @ solve_yy(ravel_pytree(grad_y_f)[0]))
        x_new, outer_state = self.outer_step(problem, x, direction, state.outer_state, alpha)
        # (8b): SGD step toward y*(x^k) plus the predicted move of y* along the (projected) x-step
        step_x = ravel_pytree(x_new)[0] - flat_x
        flat_y_new = flat_y - beta * ravel_pytree(h_g)[0] - solve_yy(H_xy.T @ step_x)

        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=1,
            grad_g=1,
            dense=4,  # h_xy and h_yy, each at (x^{k-1}, y^{k-1}) and (x^k, y^k)
        )
        return STABLEState(
            x=x_new,
            y=unravel_y(flat_y_new.astype(flat_y.dtype)),
            x_prev=x,
            y_prev=y,
            H_xy=H_xy,
            H_yy=H_yy,
            mu_g=mu_g,
            k=state.k + 1,
            key=key,
            counts=counts,
            outer_state=outer_state,
        )
