r"""FSOBO: the fully single-loop online hypergradient method of Jia, Wang & Chen (2026).

"Achieving Better Local Regret Bound for Online Non-Convex Bilevel Optimization",
arXiv:2602.06457 (reference [14] of F2OBO, arXiv:2602.11665): "a fully single-loop algorithm
whose regret bound includes an additional gradient-variation term", regret
O(1 + V_T + H_{2,T} + E_{2,T}). AOBO's round (``aobo.py``) with one y step, one linear-system
step and one x step; as for AOBO, the paper's pseudocode was not reachable, so the round is
inferred from the abstract and the F2OBO paper's Table 1.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.core import oracles
from bilevel.core.tree import tree_axpy, tree_norm
from bilevel.solvers.online.aobo import HypergradientRound
from bilevel.solvers.registry import register

__all__ = ["FSOBO"]


@register("fsobo")
@dataclasses.dataclass(frozen=True)
class FSOBO(HypergradientRound):
    r"""FSOBO (Jia, Wang & Chen, arXiv:2602.06457): the fully single-loop variant of AOBO, one
    y step, one linear-system step (v warm-started) and one x step per round::

        y_{t+1} = y_t - alpha grad_y g_t(x_t, y_t)
        v_{t+1} = v_t - beta (d2g_t/dy2 (x_t, y_{t+1}) v_t - grad_y f_t(x_t, y_{t+1}))
        x_{t+1} = Proj_X(x_t - gamma (grad_x f_t(x_t, y_{t+1}) - d2g_t/dxdy (x_t, y_{t+1}) v_{t+1}))

    Inferred (the paper's pseudocode was not reachable; module docstring): the F2OBO paper's
    Table 1 gives O(T) gradient and O(T) HVP queries and regret
    O(1 + V_T + H_{2,T} + E_{2,T}), which one step of each per round matches.

    Draws of round t (AOBO's layout with K_v = 1, the second key of ``split(state.key)``; ours,
    not the paper's: its pseudocode could not be read)::

        inner(0)   grad_y g of the y step
        inner(1)   the Hessian product d2g/dy2 v_t of the v step
        inner(2)   the cross term d2g/dxdy v_{t+1}
        outer(0)   both partials of f at y_{t+1} (grad_y f of the v step, grad_x f)

    Args:
        lr_outer: gamma, default ``"auto"`` (tuned by ``bl.solve_online`` below the stable
            bound of the round map; F2OBO paper, Appendix A: 0.001 for "all algorithms").
        lr_inner: alpha, default ``"auto"`` = 1/L_g of round 1 (Appendix A: 0.1).
        lr_linear: beta; ``None`` (default) = ``lr_inner`` [inferred, not reported].
        batch_size: ``None`` = the whole round; else one inner batch each for the y step, the
            Hessian product and the cross term, one outer batch for both partials of f.

    Per-round counts: ``grad_g = 1``, ``grad_f = 1`` (fused), ``hvp = 1``, ``cross = 1``.
    """

    name: ClassVar[str] = "fsobo"
    paper: ClassVar[str] = (
        "Jia, Wang, Chen. Achieving Better Local Regret Bound for Online Non-Convex Bilevel "
        "Optimization. arXiv:2602.06457, 2026 (FSOBO)."
    )

    def inner_update(self, g, x, y, batch, lr):
        grad = oracles.grad_y(g, x, y, batch)  # no stopping test: report the norm stepped on
        return tree_axpy(-lr, grad, y), 1, tree_norm(grad), 1
