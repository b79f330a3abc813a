"""The drivers: what runs a solver on a problem.

``solve`` (``bl.solve``) hands its loop to ``engine`` (the one loop: compiled chunks,
evaluations, divergence stops, checkpoints, the result), whose programs ``programs`` compiles
and caches (``loop``: ``bl.iterate``, the pure loop of solver steps every chunk compiles).
``online`` (``bl.solve_online``: the same engine for a stream of rounds) and ``sweep``
(``bl.sweep``: a grid of hyperparameters x seeds as one program, ``grid``) extend the engine
through its public hooks. The engine's pieces: ``results``, ``history``, ``divergence``,
``checkpoints``, ``signals``, ``checks``, ``progress`` (the progress display), ``loggers``
(``log_to=``: the history streamed to TensorBoard as it is evaluated). ``cpu_rewrites``
(``bl.CpuRewrites``) says which of the private rewrites of the compiled step for XLA:CPU
(``_xla_cpu``) are on.
"""
