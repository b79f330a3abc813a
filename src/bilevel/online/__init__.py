"""Online (streaming) bilevel optimization: ``bl.OnlineProblem`` and ``bl.solve_online``.

Modules: ``problem`` (the stream and its input checks), ``data`` (round t's samples or a
sampler's draws), ``regret`` (the bilevel local regret and its hypergradient oracles), ``run``
(the driver, built on ``bilevel.run``). The online solvers live with the others in
``bilevel.solvers`` (``solvers/online.py`` is their contract).
"""

from .problem import OnlineProblem

__all__ = ["OnlineProblem"]
