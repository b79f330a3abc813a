"""Schedule wiring (issue #34): the step size a step *applies* at iteration k is its schedule's
value at k, read back from the update the step makes on a problem where the update is linear
in the step size.

``tests/test_schedule_properties.py`` checks every schedule *function* against its paper's
formula; nothing there sees whether the step calls it with k, k + 1 or the round t - 1, or
passes the outer schedule where the inner one belongs. Here the problem is built so that every
hypergradient estimate the library has is exact and constant:

    g(x, y) = 1/2 ||y - a||^2          (no x: dy*/dx = 0, every cross term vanishes)
    f(x, y) = <c, x> + 1/2 ||y - e||^2  (grad F = c everywhere)

AID, ITD, the Neumann series, the zeroth-order path differences, the penalty gaps and the STORM
or SAGA recursions all return exactly ``c`` (their corrections are products with zero or
differences of equal terms), so the x-update of a gradient method is ``x_{k+1} = x_k - s_k c``
and the step size applied is ``s_k = <x_k - x_{k+1}, c> / ||c||^2``; a Frank-Wolfe method moves
``x_{k+1} = x_k + s_k (v_k - x_k)`` towards the box's vertex ``v_k = -sign(c)``. The inner
iterates, on ``g = 1/2 ||y - a||^2``, contract as ``y_{k+1} - a = (1 - s_k)(y_k - a)`` when one
inner step is made, which reads the inner schedules back.

Each step size is a user schedule ``k -> 0.02 (1 + k/2)`` (distinct at every k, so an off-by-one
changes the value by a third or more) unless the case names a paper regime, where the expected
value is the regime's formula written out here.
"""

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import bilevel as bl

C = np.array([0.3, -0.2])
A = np.array([1.0, -0.5, 2.0])
E = np.array([0.5, 0.5, 0.5])
N = 6  # samples per level (all equal: minibatches change nothing, so sampling solvers run too)
STEPS = 4
#: exact arithmetic but for rounding: the readouts divide differences of O(1) numbers by steps
#: of 1e-2, so float64 leaves ~1e-13 of relative error
RTOL = 1e-9


def schedule(k):
    """Distinct at every k (a third apart at k = 0 and 1): catches k + 1 for k."""
    return 0.02 * (1.0 + 0.5 * jnp.asarray(k, jnp.result_type(float)))


def linear_problem(x_set=None) -> bl.BilevelProblem:
    outer_data = {"c": jnp.tile(jnp.asarray(C), (N, 1))}
    inner_data = {"a": jnp.tile(jnp.asarray(A), (N, 1))}

    def outer(x, y, batch):
        return jnp.mean(batch["c"], axis=0) @ x + 0.5 * jnp.sum((y - E) ** 2)

    def inner(x, y, batch):
        return 0.5 * jnp.sum((y - jnp.mean(batch["a"], axis=0)) ** 2)

    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.asarray([0.1, -0.3]),
        y0=jnp.zeros(3),
        outer_data=outer_data,
        inner_data=inner_data,
        x_set=x_set,
        name="linear in x",
    )


def run_states(solver, problem, steps=STEPS, method="step"):
    state = solver.init(problem, jax.random.PRNGKey(0))
    step = jax.jit(getattr(solver, method))
    states = [state]
    for _ in range(steps):
        state = step(problem, state)
        states.append(state)
    return states


def unit_schedule(k):
    return jnp.ones((), jnp.result_type(float))


def applied_steps(solver, problem, states, field="lr_outer", leaf="x", method="step"):
    """``s_k`` of the update of ``leaf`` (``x``, ``y`` or ``z``) made with the step size
    ``field``, read from ``leaf_{k+1} = leaf_k - s_k d_k``: the same solver with the schedule
    ``k -> 1`` in ``field`` makes the move ``-d_k`` from the same state (same key, so the same
    draws and the same random directions of the zeroth-order methods), and ``s_k`` is the ratio
    of the two moves, checked to be parallel (else the readout would mean nothing). A Frank-Wolfe
    step ``x_k + s_k (v_k - x_k)`` reads alike (its unit step lands on the vertex v_k); an inner
    step on ``g = 1/2 ||y - a||^2`` alike (its unit step lands on a)."""
    unit = jax.jit(getattr(dataclasses.replace(solver, **{field: unit_schedule}), method))
    steps = []
    for before, after in zip(states[:-1], states[1:], strict=False):
        start = np.asarray(getattr(before, leaf))
        move = start - np.asarray(getattr(after, leaf))
        d = start - np.asarray(getattr(unit(problem, before), leaf))
        s = move @ d / (d @ d)
        np.testing.assert_allclose(move, s * d, rtol=RTOL, atol=1e-15)
        steps.append(s)
    return np.array(steps)


#: hyperparameters that make each solver's update the plain one read above: one inner step
#: where that is a choice (so the inner readout is one contraction), SGD outer steps
GRADIENT_SOLVERS = {
    "aid-cg": {},
    "aid-fp": {},
    "itd": {},
    "bsa": {},
    "ttsa": {},
    "stocbio": {},
    "stable": {},
    "f2sa": {},
    "f3sa": {},
    "hozog": {},
    "pzobo": {},
    "pzobo-s": {"batch_size": 3},
    "soba": {},
    "saba": {"batch_size": 3},
}


def test_every_offline_gradient_solver_is_listed():
    fw = {"ibcg", "sbfw"}
    assert set(GRADIENT_SOLVERS) | fw == set(bl.solvers.names())


@pytest.mark.parametrize("name", sorted(GRADIENT_SOLVERS))
def test_a_user_schedule_is_applied_at_k(name):
    """A schedule ``lr_outer`` is called with the step count k of the step that applies it
    (every solver passes it through ``schedules.step_size``; a solver that called it with
    k + 1, or applied the inner step size to x, would fail here)."""
    problem = linear_problem()
    solver = bl.solvers.make(name, lr_outer=schedule, **GRADIENT_SOLVERS[name]).resolve(problem)
    states = run_states(solver, problem)
    want = np.array([float(schedule(k)) for k in range(STEPS)])
    np.testing.assert_allclose(applied_steps(solver, problem, states), want, rtol=RTOL)


@pytest.mark.parametrize("name", ["ibcg", "sbfw"])
def test_frank_wolfe_steps_apply_the_schedule_at_k(name):
    """The Frank-Wolfe step ``x_k + gamma_k (v_k - x_k)`` over the box [-1, 1]^2 uses
    ``lr_outer``'s value at k (IBCG Algorithm 1 line 6; SBFW's eta_k, clipped to [0, 1], which
    these values never reach)."""
    problem = linear_problem(x_set=bl.sets.Box(-1.0, 1.0))
    solver = bl.solvers.make(name, lr_outer=schedule).resolve(problem)
    states = run_states(solver, problem)
    want = np.array([float(schedule(k)) for k in range(STEPS)])
    np.testing.assert_allclose(applied_steps(solver, problem, states), want, rtol=RTOL)


K0 = 3.0  # a k0 other than the default 1, so that a solver ignoring its k0 field fails

#: (solver, its hyperparameters, the outer order a, the inner order b) of the papers' decaying
#: regimes, step_k = step_0 (k0 / (k + k0))^order: Ghadimi & Wang's BSA (1, 1); Hong et al.'s
#: TTSA (1, 2/3); STABLE's Theorem 3, eq. (30a) (1, 1); SOBA's Theorem 1 (3/5, 2/5); F2SA's
#: Corollary 4.2 (a) (5/7 for alpha_k, 4/7 for gamma_k); F3SA's Corollary 4.4 (a) (3/5, 2/5)
REGIMES = [
    ("bsa", {"regime": "strongly-convex", "inner_steps": 1}, 1.0, 1.0, "y"),
    ("ttsa", {"regime": "strongly-convex"}, 1.0, 2 / 3, "y"),
    ("stable", {"regime": "strongly-convex"}, 1.0, 1.0, "y"),
    ("soba", {"regime": "decreasing"}, 3 / 5, 2 / 5, "y"),
    ("f2sa", {"regime": "stochastic", "inner_steps": 1}, 5 / 7, 4 / 7, "z"),
    ("f3sa", {"regime": "stochastic"}, 3 / 5, 2 / 5, "z"),
]


@pytest.mark.parametrize(("name", "hyper", "a", "b", "leaf"), REGIMES, ids=[r[0] for r in REGIMES])
def test_decaying_regimes_apply_their_power_laws_at_k(name, hyper, a, b, leaf):
    """A float step of a decaying regime is applied as ``step_0 (k0/(k + k0))^order`` at
    iteration k, for x (order a) and for the inner iterate (order b: y, or F2SA's / F3SA's z,
    whose update ``z - gamma_k grad_y g(x, z)`` holds the inner step alone)."""
    problem = linear_problem()
    lr_outer, lr_inner = 0.05, 0.3
    solver = bl.solvers.make(name, lr_outer=lr_outer, lr_inner=lr_inner, k0=K0, **hyper)
    solver = solver.resolve(problem)
    states = run_states(solver, problem)
    ks = np.arange(STEPS)
    decay = K0 / (ks + K0)
    np.testing.assert_allclose(
        applied_steps(solver, problem, states), lr_outer * decay**a, rtol=RTOL
    )
    inner = applied_steps(solver, problem, states, field="lr_inner", leaf=leaf)
    np.testing.assert_allclose(inner, lr_inner * decay**b, rtol=RTOL)


@pytest.mark.parametrize("inner_decay", [0.5, "auto"])
def test_sbfw_theory_steps_are_applied_at_k(inner_decay):
    """SBFW's steps (IBCG paper App. G.1): ``eta_k = eta_1 (2/(k + 2))^(3/4)`` on x and
    ``delta_k = a_0 / (k + 1)^(1/2)`` on y, read back from the updates; with the library's
    default ``inner_decay="auto"`` and full batches, a constant ``delta_k = delta_1``."""
    problem = linear_problem(x_set=bl.sets.Box(-1.0, 1.0))
    solver = bl.solvers.make("sbfw", lr_outer=0.4, lr_inner=0.2, inner_decay=inner_decay)
    solver = solver.resolve(problem)
    states = run_states(solver, problem)
    ks = np.arange(STEPS)
    np.testing.assert_allclose(
        applied_steps(solver, problem, states), 0.4 * (2 / (ks + 2)) ** 0.75, rtol=RTOL
    )
    inner = applied_steps(solver, problem, states, field="lr_inner", leaf="y")
    power = 0.0 if inner_decay == "auto" else inner_decay
    np.testing.assert_allclose(inner, 0.2 / (ks + 1.0) ** power, rtol=RTOL)


def test_pzobo_meta_outer_schedule_is_applied_at_k():
    """PZOBOMeta's ``phi <- phi - beta_k P(gradhat)`` (Sow et al., App. B.4) with plain SGD as P:
    the applied beta_k is ``lr_outer``'s value at the state's k (the code's drops are such a
    schedule, :func:`bilevel.meta.pzobo.code_outer_schedule`)."""
    meta = bl.meta.make("pzobo", lr_outer=schedule, outer_optimizer="sgd")
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    grad = {"w": jnp.asarray([0.3, 0.1, -0.4])}
    opt_state = optax.identity().init(params)
    for k in range(STEPS):
        state = types.SimpleNamespace(params=params, opt_state=opt_state, k=jnp.asarray(k))
        new, _ = meta._outer_update(state, grad)
        move = np.asarray(params["w"]) - np.asarray(new["w"])
        np.testing.assert_allclose(move, float(schedule(k)) * np.asarray(grad["w"]), rtol=RTOL)


def linear_stream(horizon=STEPS + 2) -> bl.OnlineProblem:
    """The same problem as a stream of identical rounds (round t's losses take t and ignore
    it): every online hypergradient estimate is c, as offline."""
    outer_data = {"c": jnp.tile(jnp.asarray(C), (horizon, N, 1))}
    inner_data = {"a": jnp.tile(jnp.asarray(A), (horizon, N, 1))}

    def outer(t, x, y, batch):
        return jnp.mean(batch["c"], axis=0) @ x + 0.5 * jnp.sum((y - E) ** 2)

    def inner(t, x, y, batch):
        return 0.5 * jnp.sum((y - jnp.mean(batch["a"], axis=0)) ** 2)

    return bl.OnlineProblem(
        outer=outer,
        inner=inner,
        horizon=horizon,
        x0=jnp.asarray([0.1, -0.3]),
        y0=jnp.zeros(3),
        outer_data=outer_data,
        inner_data=inner_data,
        name="linear stream",
    )


@pytest.mark.parametrize("name", bl.solvers.names("online"))
def test_online_rounds_apply_the_schedule_at_round_t(name):
    """Round t = 1, 2, ... applies ``lr_outer``'s value at t (``round_step_size``: a schedule is
    called with the round itself, the t of the papers' gamma_t), not at t - 1 or t + 1."""
    problem = linear_stream()
    solver = bl.solvers.make(name, lr_outer=schedule).resolve(problem)
    states = run_states(solver, problem, method="round")
    want = np.array([float(schedule(t)) for t in range(1, STEPS + 1)])
    got = applied_steps(solver, problem, states, method="round")
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_f2obo_sl_decays_its_outer_step_as_t_to_the_minus_tau():
    """F2OBO-SL (Theorem 3.2): ``gamma_t = gamma_1 t^-tau``, applied at round t."""
    problem = linear_stream()
    solver = bl.solvers.make("f2obo-sl", lr_outer=0.05, tau=0.4).resolve(problem)
    states = run_states(solver, problem, method="round")
    t = np.arange(1, STEPS + 1)
    got = applied_steps(solver, problem, states, method="round")
    np.testing.assert_allclose(got, 0.05 * t**-0.4, rtol=RTOL)


@pytest.mark.parametrize("name", sorted(bl.solvers.names()))
def test_state_counts_steps_in_int32_and_starts_an_optax_outer_state(name):
    """Two slips mutation testing found unkilled (docs/testing.md): ``k`` created as a float
    (user schedules get the int32 step count, as optax schedules expect), and the outer
    optimiser's state initialised from something other than x0 (invisible with plain SGD,
    whose state is empty): with Adam the state holds x-shaped moments."""
    frank_wolfe = name in ("ibcg", "sbfw")  # they refuse an outer optimiser: a FW step
    problem = linear_problem(x_set=bl.sets.Box(-1.0, 1.0) if frank_wolfe else None)
    optimiser = "sgd" if frank_wolfe else "adam"
    hyper = dict(GRADIENT_SOLVERS.get(name, {}), lr_outer=0.01, outer_optimizer=optimiser)
    solver = bl.solvers.make(name, **hyper).resolve(problem)
    state = solver.init(problem, jax.random.PRNGKey(0))
    assert state.k.dtype == jnp.int32
    if frank_wolfe:
        return
    moments = [a for a in jax.tree.leaves(state.outer_state) if a.shape == (2,)]
    assert moments, f"{name}: no x-shaped leaf in the Adam state"


@pytest.mark.parametrize("name", sorted(GRADIENT_SOLVERS))
def test_a_tail_decay_is_applied_from_its_start(name):
    """``TailDecay(value, start, factor)``, the form of a tuned ``lr_outer`` on a run with
    minibatches (``bilevel.drivers.tuning``, point 6), applies ``value`` before ``start`` and
    ``factor * value`` from it, times the method's own decay: the plain step of the solver's
    default law, read back at k, is multiplied by the factor from k = start on."""
    problem = linear_problem()
    plain = bl.solvers.make(name, lr_outer=0.05, **GRADIENT_SOLVERS[name]).resolve(problem)
    tail = dataclasses.replace(plain, lr_outer=bl.schedules.TailDecay(0.05, 2.0, 0.1))
    want = applied_steps(plain, problem, run_states(plain, problem))
    got = applied_steps(tail, problem, run_states(tail, problem))
    np.testing.assert_allclose(got, want * np.array([1.0, 1.0, 0.1, 0.1]), rtol=RTOL)


#: every gradient solver with its defaults, then each decaying regime (with K0 as above)
CONSTANT_OR_DECAYING = sorted(GRADIENT_SOLVERS.items()) + [
    (name, {**hyper, "k0": K0}) for name, hyper, *_ in REGIMES
]


@pytest.mark.parametrize(
    ("name", "hyper"), CONSTANT_OR_DECAYING, ids=[n for n, _ in CONSTANT_OR_DECAYING]
)
def test_outer_step_decays_says_whether_the_applied_step_decays(name, hyper):
    """``solver.outer_step_decays(problem)`` (which tells ``bl.solve`` to add no tail decay to
    a tuned step) is true exactly where the x step the solver applies with a float
    ``lr_outer`` shrinks over the first steps: the defaults and every decaying regime."""
    problem = linear_problem()
    solver = bl.solvers.make(name, lr_outer=0.05, **hyper)
    solver = solver.resolve(problem)
    steps = applied_steps(solver, problem, run_states(solver, problem))
    decays = bool(steps[-1] < steps[0] * (1 - 1e-6))
    assert solver.outer_step_decays(problem) == decays, steps
