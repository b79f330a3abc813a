"""The drivers: what runs a solver on a problem.

``run`` (``bl.solve``: the compiled loop, evaluation, divergence stops, checkpoints and
results), ``online`` (``bl.solve_online``: the same for a stream of rounds), ``sweep``
(``bl.sweep``: a grid of hyperparameters x seeds as one program) and ``progress`` (the progress
display). ``_xla_cpu`` holds the optional, private rewrites of the compiled step for XLA:CPU.
"""
