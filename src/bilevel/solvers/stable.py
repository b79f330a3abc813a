r"""STABLE: single-timescale stochastic bilevel optimization (Algorithm 1, eqs. (8)-(9)).

Chen, Sun, Xiao, Yin. "A Single-Timescale Method for Stochastic Bilevel Optimization."
AISTATS 2022 (arXiv:2102.04671). Spec: ``shared/specs/stable.md``.

STABLE keeps recursive (STORM-style) estimates of the two dense second-order matrices of the
lower level, the cross Jacobian H_xy ~ d^2 g/dx dy (dim x by dim y) and the Hessian
H_yy ~ d^2 g/dy^2, and uses them twice: in the x-direction (the implicit hypergradient (5) at
the current y) and in a y-step that *predicts* the motion of y*(x) along the x-step,
y*(x^{k+1}) - y*(x^k) ~ -H_yy^{-1} H_xy^T (x^{k+1} - x^k). That correction is what lets x and
y use step sizes of the same order (Lemma 3). The matrices are materialised, so the method
costs O(dim y^2) memory and an O(dim y^3) eigendecomposition per step (Table 1): it is meant
for small lower levels (the paper's experiments have dim y = 14, 22 and 54).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .. import oracles
from ..oracles import Counts
from ..problem import BilevelProblem
from .base import OuterState, Solver
from .registry import register

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

#: Step-size orders. "constant": alpha, beta, tau fixed (Theorem 2, nonconvex: all
#: Theta(1/sqrt(K)) for a horizon K, so the user scales the constants with K).
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


def floor_eigenvalues(matrix: jax.Array, floor) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``Punder``: the projection onto ``{M : M >= floor I}`` in the Frobenius norm (eq. (9b)).

    For symmetric ``M = Q diag(lam) Q^T`` it is ``Q diag(max(lam, floor)) Q^T``. The input is
    symmetrised first, ``(M + M^T)/2``, which is itself the Frobenius projection onto the
    symmetric matrices and removes round-off asymmetry (every sampled Hessian is symmetric).

    Returns:
        ``(projected, eigenvalues, eigenvectors)``: the projected matrix and its
        eigendecomposition (eigenvalues >= floor, ascending), so solves with it cost O(n^2).
    """
    sym = 0.5 * (matrix + matrix.T)
    lam, q = jnp.linalg.eigh(sym)
    lam = jnp.maximum(lam, floor)
    return (q * lam[None, :]) @ q.T, lam, q


class STABLEState(NamedTuple):
    x: PyTree  # upper iterate x^k
    y: PyTree  # lower iterate y^k, tracks y*(x^k)
    x_prev: PyTree  # x^{k-1}: where the STORM correction h^{k-1}(phi^k) is evaluated (x^0 at k=0)
    y_prev: PyTree  # y^{k-1} (y^0 at k = 0)
    H_xy: jax.Array  # H_xy^{k-1}: estimate of d^2 g/dx dy, (dim x, dim y), ||.||_F <= C_gxy
    H_yy: jax.Array  # H_yy^{k-1}: estimate of d^2 g/dy^2, (dim y, dim y), symmetric, >= mu_g I
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

    Pbar is the Frobenius-ball projection of radius ``max_cross_norm`` (the paper's C_gxy) and
    Punder the eigenvalue floor at ``mu_g`` (Assumption 2's strong-convexity constant). The y-step
    uses the projected x-step (x first, Gauss-Seidel). On the deterministic quadratic with exact
    matrices the correction makes the y-error obey e_{k+1} = (I - beta_k A) e_k exactly.

    Choices the paper leaves open (spec sections 2.2 and 7), made here:

    * k = 0: (x^{-1}, y^{-1}) := (x^0, y^0) and tau_0 := 1, so H^0 = P(h^0(phi^0)): the first
      estimate is the first sample's matrix (the spec's alternative); no extra samples.
    * ``mu_g="auto"``: the paper treats mu_g as a known constant (a lower bound on the
      eigenvalues of d^2 g/dy^2 everywhere) and reports no value. "auto" takes half the
      smallest eigenvalue at (x0, y0) estimated by ``bl.diagnose`` (Lanczos on the full-data
      Hessian): the factor 1/2 is a margin, since the start point's value is only an estimate
      of the global bound and a floor that is too high biases H_yy (pitfall 5).
    * ``max_cross_norm=None`` (no clip): C_gxy bounds E||d^2 g/dx dy(.; phi)||^2 (Assumption 3)
      and has no value in the paper, whose Remark says the projections are there for the
      analysis. Give a float to clip.
    * ``tau=None`` is tau_k = beta_k (Theorem 3 sets them equal; Theorem 2 has both ~ 1/sqrt(K)).
    * Step sizes: the paper's experiments (Sec. 4) follow each theorem's order and pick the
      constants from {1, 0.5, 0.1, 0.05, 0.01}; ``regime`` gives the order, ``lr_*`` the constant.

    Args:
        lr_outer: alpha, the x step (initial value under "strongly-convex"), or a schedule.
        lr_inner: beta, the y step, or a schedule; ``"auto"`` (default) is 1/L_g from
            ``bl.diagnose``. Theory: beta <= (mu_g/L_g)/(32(mu_g + L_g)) and alpha <= beta.
        batch_size: size of phi^k and xi^k (None = full data). The paper's Algorithm 1 draws one
            datum; a minibatch is averaged inside every oracle.
        tau: STORM weight tau_k in (0, 1], float (initial value) or schedule; None = beta_k.
        mu_g: eigenvalue floor of H_yy (> 0), or "auto" (see above).
        max_cross_norm: C_gxy, the Frobenius radius of H_xy, or None (no clip).
        regime: "constant" (Theorem 2's constant steps) or "strongly-convex" (Theorem 3:
            alpha_k, beta_k, tau_k ~ k0 / (k0 + k), floats are the k = 0 values).
        k0: the offset K_0 of the strongly convex schedule (the paper: "sufficiently large").

    References:
        Chen, Sun, Xiao, Yin. "A Single-Timescale Method for Stochastic Bilevel Optimization."
        AISTATS 2022. Cutkosky & Orabona, "Momentum-based variance reduction in non-convex SGD"
        (STORM), NeurIPS 2019, for the recursive estimator.

    Assumptions: g(x, .) mu_g-strongly convex; f, g smooth with Lipschitz second derivatives
    (Assumptions 1-3); X closed convex; y unconstrained. Costs O(dim y^2) memory and one
    O(dim y^3) eigendecomposition per step.
    """

    lr_outer: Any = 0.01
    lr_inner: Any = "auto"
    batch_size: int | None = None
    tau: Any = None
    mu_g: Any = "auto"
    max_cross_norm: float | None = None
    regime: str = "constant"
    k0: float = 100.0

    name: ClassVar[str] = "stable"
    #: ``mu_g="auto"`` is this factor times the Lanczos estimate of lambda_min at (x0, y0)
    auto_mu_g_factor: ClassVar[float] = 0.5

    def validate(self) -> None:
        if self.regime not in STABLE_REGIMES:
            raise ValueError(
                f"STABLE(regime={self.regime!r}) is unknown; use one of {STABLE_REGIMES}."
            )
        if not (isinstance(self.k0, int | float) and self.k0 > 0):
            raise ValueError(f"STABLE(k0=...) must be > 0, got {self.k0!r}.")
        if isinstance(self.mu_g, str):
            if self.mu_g != "auto":
                raise ValueError(
                    f"STABLE(mu_g={self.mu_g!r}) must be a positive float or 'auto' (half the "
                    "smallest eigenvalue of d^2 g/dy^2 at (x0, y0), from bl.diagnose)."
                )
        elif isinstance(self.mu_g, bool) or not (
            isinstance(self.mu_g, int | float) and 0 < self.mu_g < float("inf")
        ):
            raise ValueError(
                f"STABLE(mu_g=...) must be a positive finite float (a lower bound on the "
                f"eigenvalues of d^2 g/dy^2) or 'auto', got {self.mu_g!r}."
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
                    f"STABLE(tau=...) must be in (0, 1], a schedule, or None (= beta_k), got "
                    f"{self.tau!r}."
                )

    def check_problem(self, problem: BilevelProblem) -> None:
        super().check_problem(problem)
        dim_y = int(ravel_pytree(problem.y0)[0].size)
        if dim_y > DENSE_DIM_LIMIT:
            dim_x = int(ravel_pytree(problem.x0)[0].size)
            warnings.warn(
                f"STABLE materialises dense matrices: dim(y) = {dim_y} means an inner Hessian "
                f"of {dim_y}x{dim_y} and a cross Jacobian of {dim_x}x{dim_y} (O(dim_y^2) "
                f"memory) and an O(dim_y^3) eigendecomposition every step. For a lower level "
                f"this large use a Hessian-vector-product or first-order method such as "
                f"'stocbio', 'aid-cg', 'f2sa' or 'pzobo-s'.",
                DenseHessianWarning,
                stacklevel=2,
            )

    def resolve(self, problem: BilevelProblem) -> STABLE:
        solver = super().resolve(problem)
        if solver.mu_g == "auto":
            from ..diagnose import diagnose

            d = diagnose(problem, warn=False)
            if not d.strongly_convex:
                raise ValueError(
                    f"STABLE(mu_g='auto'): the inner problem does not look strongly convex at "
                    f"(x0, y0) (smallest Hessian eigenvalue ~ {d.mu_g:.3g}); STABLE needs a "
                    "positive floor: give mu_g explicitly."
                )
            solver = dataclasses.replace(solver, mu_g=self.auto_mu_g_factor * d.mu_g)
        return solver

    def _check_resolved(self) -> None:
        for name in ("mu_g", "lr_inner"):
            if getattr(self, name) == "auto":
                raise ValueError(
                    f"STABLE({name}='auto') is resolved from the problem by bl.solve; when "
                    f"calling init/step directly use solver.resolve(problem) first or give "
                    f"{name} as a number."
                )

    def step_sizes(self, k) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(alpha_k, beta_k, tau_k)``: floats scaled by the regime's decay, schedules as given."""
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        decay = 1.0 if self.regime == "constant" else self.k0 / (kf + self.k0)

        def rate(value):
            return value(kf) if callable(value) else value * decay

        beta = rate(self.lr_inner)
        tau = beta if self.tau is None else rate(self.tau)
        return rate(self.lr_outer), beta, jnp.minimum(tau, 1.0)

    def init(self, problem: BilevelProblem, key: jax.Array) -> STABLEState:
        self._check_resolved()
        flat_x, _ = ravel_pytree(problem.x0)
        flat_y, _ = ravel_pytree(problem.y0)
        dtype = jnp.result_type(flat_x.dtype, flat_y.dtype)
        dim_x, dim_y = flat_x.size, flat_y.size
        return STABLEState(
            x=problem.x0,
            y=problem.y0,
            x_prev=problem.x0,
            y_prev=problem.y0,
            # never used: tau_0 = 1 makes H^0 = P(h^0(phi^0)); kept feasible all the same
            H_xy=jnp.zeros((dim_x, dim_y), dtype),
            H_yy=self.mu_g * jnp.eye(dim_y, dtype=dtype),
            k=jnp.zeros((), jnp.int32),
            key=key,
            counts=Counts.zeros(),
            outer_state=self.outer_init(problem.x0),
        )

    def step(self, problem: BilevelProblem, state: STABLEState) -> STABLEState:
        self._check_resolved()
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
        tau = jnp.where(state.k == 0, 1.0, tau)  # k = 0: H^0 = P(h^0(phi^0)) (spec 2.2)

        # (9a): cross Jacobian estimate, d2g/dxdy is (dim x, dim y)
        h_xy_prev = oracles.jacobian_xy(g, x_prev, y_prev, phi)
        h_xy = oracles.jacobian_xy(g, x, y, phi)
        H_xy = clip_frobenius((1 - tau) * (state.H_xy - h_xy_prev) + h_xy, self.max_cross_norm)
        # (9b): inner Hessian estimate, floored at mu_g; its eigendecomposition serves both solves
        h_yy_prev = oracles.hessian_yy(g, x_prev, y_prev, phi)
        h_yy = oracles.hessian_yy(g, x, y, phi)
        H_yy, lam, Q = floor_eigenvalues((1 - tau) * (state.H_yy - h_yy_prev) + h_yy, self.mu_g)

        def solve_yy(v):  # (H_yy^k)^{-1} v
            return Q @ ((Q.T @ v) / lam)

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
            k=state.k + 1,
            key=key,
            counts=counts,
            outer_state=outer_state,
        )
