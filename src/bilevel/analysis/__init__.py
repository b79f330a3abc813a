"""Exact answers and diagnostics: hypergradients and metrics (``metrics``), curvature
estimates (``diagnose``) and the online bilevel local regret (``regret``).

Built on ``bilevel.core`` only; the solvers and drivers use these, never the reverse.
"""
