"""Helpers shared by the online-solver tests: playing rounds outside ``solve_online``, and the
minibatches a round drew (to rebuild them in a numpy replica)."""

import jax

from bilevel.core import sampling
from bilevel.core.streams import round_slice


def play_rounds(solver, problem, n: int, key: int = 0) -> list:
    """The states after rounds 1..n of ``solver`` on ``problem`` (a jitted ``round``), from
    ``jax.random.key(key)``: ``states[t - 1]`` holds x_{t+1}, y_{t+1}, ..."""
    state = solver.init(problem, jax.random.key(key))
    play = jax.jit(solver.round)
    states = []
    for _ in range(n):
        state = play(problem, state)
        states.append(state)
    return states


def round_draws(problem, state, t: int, batch_size, *, outer: int, inner: int):
    """The minibatches round t draws from ``state`` (the state before round t): the solver
    splits ``state.key`` and draws with the second key from round t's held samples
    (``OnlineSolver.round_batches``)."""
    _, batch_key = jax.random.split(state.key)
    return sampling.minibatches(
        batch_key,
        round_slice(problem.outer_data, t),
        round_slice(problem.inner_data, t),
        batch_size,
        outer=outer,
        inner=inner,
    )


def key_draws(problem, key, t: int, batch_size, *, outer: int, inner: int):
    """The minibatches a solver draws from round t's held samples with ``key`` itself (a key
    the solver derived from ``state.key``: AF2OBO's ``fold_in(loop key, i)``, OAGD's member
    keys), as ``OnlineSolver.round_batches`` draws them."""
    return sampling.minibatches(
        key,
        round_slice(problem.outer_data, t),
        round_slice(problem.inner_data, t),
        batch_size,
        outer=outer,
        inner=inner,
    )
