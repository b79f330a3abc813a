"""The lowest layer: what a bilevel problem is and the tools every method uses.

Both problem types (``problem``: ``BilevelProblem``; ``online_problem``: ``OnlineProblem``),
derivatives and their call counts (``oracles``), minibatch sampling of data (``sampling``) and
of streams (``streams``), constraint sets (``sets``), linear solvers (``linsolve``), step-size
schedules (``schedules``), pytree arithmetic (``tree``) and data parallelism (``sharding``).
Nothing here imports from the layers above (``analysis``, ``solvers``, ``drivers``, ...).
"""
