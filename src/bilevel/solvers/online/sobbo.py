r"""SOBBO: the stochastic OBBO, with a window average of stored hypergradients (baseline).

Bohne, Rosenberg, Kazantsev, Polak. "Online Nonconvex Bilevel Optimization with Bregman
Divergences." arXiv:2409.10470 (2024). OBBO's round (``obbo.py``) on minibatches, the x step
along the weighted average of the last w stored ITD estimates; the F2OBO paper (Jia & Chen,
arXiv:2602.11665) runs it in its Experiment 2 (Appendix A).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.solvers.online.obbo import OBBO
from bilevel.solvers.registry import register

__all__ = ["SOBBO"]


@register("sobbo")
@dataclasses.dataclass(frozen=True)
class SOBBO(OBBO):
    r"""SOBBO (Bohne et al., arXiv:2409.10470): OBBO on minibatches with the x step along the
    window average of the last w stored stochastic ITD hypergradients (module docstring).

    Defaults: window w = 10 (SOBOW's), and OBBO's ``inner_steps="auto"`` (K ~ log T for the
    run's horizon; Experiment 2 used K = 5), ``lr_inner`` and ``lr_outer``. Experiment 2's
    window w = 50 (with alpha = 0.1, gamma = 0.001 and its batch of 256 per round) is
    ``window=50``: a window of w stored estimates delays the x step by about w/2 rounds, and
    its round map is stable only for a step about w times smaller than a plain step's
    (``OnlineSolver.stable_outer_step``), too small to track a stream of a few hundred rounds
    at w = 50. Per-round counts as OBBO's: one ITD estimate per round, none re-evaluated.

    Draws of round t: OBBO's (``inner(k)`` for unrolled step k < K, ``outer(0)`` for the ITD
    hypergradient); the stored estimates of earlier rounds are not re-drawn.
    """

    window: int = 10

    name: ClassVar[str] = "sobbo"
