r"""ITD-R: iterative differentiation in reverse mode through the unrolled inner loop (baseline).

Franceschi, Donini, Frasconi, Pontil. "Forward and Reverse Gradient-Based Hyperparameter
Optimization." ICML 2017 (REVERSE-HG). Grazzi, Franceschi, Pontil, Salzo. "On the Iteration
Complexity of Hypergradient Computation." ICML 2020 (ITD, hypertorch ``reverse``). The PZOBO paper
runs it as "ITD-R" / "REVERSE" (Sow, Ji & Liang, NeurIPS 2022, App. B.1).

The hypergradient is the exact gradient of the N-step surrogate

    F_N(x) = f(x, y_N(x)),    y_{t+1}(x) = y_t(x) - lr_inner grad_y g(x, y_t(x)),   y_0 fixed,

taken by reverse-mode autodiff through the ``lax.scan`` of the inner loop. The backward pass is
the adjoint recursion ``h += (dPsi_t/dx)^T a, a <- (dPsi_t/dy)^T a`` for t = N-1..0 with
``Psi_t(y) = y - lr grad_y g(x, y)``: one Hessian-vector product and one cross product per step,
and O(N dim y) memory for the stored trajectory.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import Minibatches
from bilevel.core.schedules import step_size
from bilevel.solvers.base import IterateState, Solver
from bilevel.solvers.common import inner_sgd
from bilevel.solvers.registry import register

PyTree = Any


ITDState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


def unrolled_hypergradient(
    problem, mb: Minibatches, x: PyTree, y: PyTree, lr, num_steps: int
) -> tuple[PyTree, PyTree]:
    """``(grad F_N(x), y_N)``: reverse mode through ``num_steps`` (S)GD steps on ``problem.inner``
    from ``y`` (held constant), ``F_N(x) = problem.outer(x, y_N(x), mb.outer(0))``; step k uses
    ``mb.inner(k)``. ``problem`` is anything with ``.outer`` and ``.inner`` level functions (a
    BilevelProblem, or an online round's ``Levels``). Calls: ``grad_f = 1`` (both partials at
    the end), ``grad_g = num_steps`` forward, ``hvp = cross = num_steps`` backward."""
    y0 = jax.lax.stop_gradient(y)

    def unrolled_outer(x_):  # F_N(x) = f(x, y_N(x)), y_N a lax.scan of N steps
        y_N = inner_sgd(problem, mb, x_, y0, lr, num_steps)
        return problem.outer(x_, y_N, mb.outer(0)), y_N

    return jax.grad(unrolled_outer, has_aux=True)(x)


@register("itd")
@dataclasses.dataclass(frozen=True)
class ITD(Solver):
    r"""ITD-R (Franceschi et al., ICML 2017; Grazzi et al., ICML 2020): reverse-mode
    differentiation through N unrolled inner (S)GD steps.

    Per iteration k::

        y_0 = previous y_N (warm start, held constant: dy_0/dx = 0) or problem.y0
        y_{t+1} = y_t - lr_inner grad_y g(x_k, y_t; B_t),   t < N
        x <- Proj_X(x_k - lr_outer d/dx f(x, y_N(x); D_F) |_{x = x_k})       (reverse mode)

    With ``batch_size`` every unrolled step uses its own minibatch B_t (differentiating through
    SGD); the PZOBO paper runs ITD only deterministically ("no stochastic version").

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches)::

        inner(t), t < N   unrolled step t: its gradient forward, and its Hessian-vector and
                          cross products in the backward pass (the same B_t)
        outer(0)          both partials of f at (x_k, y_N), D_F

    Args:
        lr_outer: x step, float or schedule.
        lr_inner: inner (S)GD step, float or schedule; ``"auto"`` (default) is ``1/L_g``.
        batch_size: size of every minibatch (None = full data).
        inner_steps: N, unrolled steps. The truncation bias of the Jacobian decays as
            (1 - lr_inner mu_g)^N (Grazzi et al. 2020, Thm. 2.1), so N must grow as the step
            falls: ``"auto"`` (default) starts at 20, and where ``bl.solve`` lowers the
            ``"auto"`` inner step as L_g rises it multiplies N by the same factor (in powers of
            2, at most 8: :mod:`bilevel.drivers.curvature`). A number is kept as given.
        warm_start: start the inner loop from the previous y_N (hypertorch, PZOBO code); the
            start is treated as independent of x either way.

    References:
        Franceschi, Donini, Frasconi, Pontil. "Forward and Reverse Gradient-Based
        Hyperparameter Optimization." ICML 2017. Grazzi, Franceschi, Pontil, Salzo. "On the
        Iteration Complexity of Hypergradient Computation." ICML 2020.

    Assumptions: g(x, .) strongly convex and smooth, lr_inner < 2 / L_g.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int | str = "auto"
    warm_start: bool = True

    name: ClassVar[str] = "itd"
    auto_counts: ClassVar[dict[str, int]] = {"inner_steps": 20}
    paper: ClassVar[str] = (
        "Franceschi, Donini, Frasconi, Pontil. Forward and Reverse Gradient-Based "
        "Hyperparameter Optimization. ICML 2017."
    )

    def hypergradient(
        self, problem: BilevelProblem, x: PyTree, y: PyTree, mb: Minibatches, k=0
    ) -> tuple[PyTree, PyTree]:
        """``(grad F_N(x), y_N)`` for the loop started at ``y`` (``mb``: ``outer=1``,
        ``inner=N``)."""
        lr = step_size(self.lr_inner, k)
        return unrolled_hypergradient(problem, mb, x, y, lr, self.inner_steps)

    def init(self, problem: BilevelProblem, key: jax.Array) -> ITDState:
        return self.initial_state(problem, key)

    def step(self, problem: BilevelProblem, state: ITDState) -> ITDState:
        N = self.inner_steps
        key, batch_key = jax.random.split(state.key)
        mb = self.minibatches(problem, batch_key, outer=1, inner=N)
        y_start = state.y if self.warm_start else problem.y0
        hypergrad, y = self.hypergradient(problem, state.x, y_start, mb, state.k)
        x_new, outer_state = self.outer_step(
            problem, state.x, hypergrad, state.outer_state, step_size(self.lr_outer, state.k)
        )
        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=1,  # both partials of f at (x, y_N), from the start of the backward pass
            grad_g=N,  # forward pass
            hvp=N,  # backward pass: (dPsi_t/dy)^T a per unrolled step ...
            cross=N,  # ... and (dPsi_t/dx)^T a
        )
        return ITDState(
            x=x_new, y=y, k=state.k + 1, key=key, counts=counts, outer_state=outer_state
        )
