"""Models as variables: an equinox model, whose leaves are not all arrays, as x or as y.

The proof that the model view changes nothing: each problem is written twice, once with an
``eqx.nn.MLP`` (its activation a ``jax.custom_jvp`` leaf, its final activation a lambda) and once
with a plain list of the same arrays, ``[(W0, b0), (W1, b1)]``, and a hand-written forward pass
doing the same float64 operations in the same order. Every solver then takes the same steps on
both: the iterates agree to 1e-12 relative at every step (in practice bit for bit). To keep the
file cheap, each solver's two trajectories are one compiled program (``init`` and ``step``
straight, as ``bl.solve`` runs them); the driver's own path (history, seeds, checkpoints,
``init=``, ``bl.sweep``, x_set metrics) is checked on a few solvers through ``bl.solve``.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from solver_settings import frank_wolfe, settings

import bilevel as bl
from bilevel.core.problem import split_model

N, D, K = 8, 2, 2  # samples per level (and per round), input size, feature size
MU = 1.0  # the inner ridge: g is MU-strongly convex in y
RADIUS = 10.0  # the Frank-Wolfe methods' ball (x0 lies inside it)
STEPS = 3
RTOL = 1e-12  # same operations in the same order: only a reordered reduction could differ
#: XLA:CPU options for the trajectory programs: a few steps on arrays of a dozen entries gain
#: nothing from LLVM's optimisation passes, which are most of their compile time
QUICK_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _float64(model):
    return jax.tree.map(lambda a: jnp.asarray(a, float) if eqx.is_inexact_array(a) else a, model)


def _mlp(in_size=D, out_size=K, seed=0):
    """A tiny MLP in -> 3 -> out with relu (its leaves: 4 arrays and 2 functions)."""
    return _float64(eqx.nn.MLP(in_size, out_size, 3, 1, key=jax.random.key(seed)))


def _plain(mlp):
    """The MLP's arrays as a plain pytree: [(W0, b0), (W1, b1)]."""
    return [(layer.weight, layer.bias) for layer in mlp.layers]


def _plain_forward(params, a):
    """What ``eqx.nn.MLP.__call__`` computes for one sample, spelled out."""
    (w0, b0), (w1, b1) = params
    return w1 @ jax.nn.relu(w0 @ a + b0) + b1


def _model_forward(model, a):
    return model(a)


def _squares(tree):
    return sum(jnp.sum(a**2) for a in jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array)))


def _data(seed, rounds=None):
    lead = () if rounds is None else (rounds,)
    ka, kt = jax.random.split(jax.random.key(seed))
    return {"a": jax.random.normal(ka, (*lead, N, D)), "t": jax.random.normal(kt, (*lead, N))}


def _features_loss(forward):
    """Hyper-representation: squared loss of the linear head y on features forward(x, a)."""

    def loss(x, y, batch):
        feats = jax.vmap(lambda a: forward(x, a))(batch["a"])
        return 0.5 * jnp.mean((feats @ y - batch["t"]) ** 2)

    return loss


def _x_problem(x0, forward, x_set=None):
    """x = the feature map (an MLP or its arrays), y = a ridge head: g strongly convex in y."""
    loss = _features_loss(forward)
    return bl.BilevelProblem(
        outer=loss,
        inner=lambda x, y, b: loss(x, y, b) + 0.5 * MU * jnp.sum(y**2),
        x0=x0,
        y0=jnp.zeros(K),
        outer_data=_data(1),
        inner_data=_data(2),
        x_set=x_set,
    )


def _y_problem(y0, forward):
    """x = per-feature input scales, y = a small network fitted on the scaled inputs (with a
    ridge on its parameters); the outer loss adds a ridge on x."""

    def inner(x, y, batch):
        out = jax.vmap(lambda a: forward(y, x * a))(batch["a"])[:, 0]
        return 0.5 * jnp.mean((out - batch["t"]) ** 2) + 0.5 * MU * _squares(y)

    return bl.BilevelProblem(
        outer=lambda x, y, b: inner(x, y, b) + 0.1 * jnp.sum(x**2),
        inner=inner,
        x0=jnp.ones(D),
        y0=y0,
        outer_data=_data(1),
        inner_data=_data(2),
    )


@pytest.fixture(scope="module")
def x_pairs():
    """{"free" | "ball": (problem with the MLP as x, the same with its arrays)}."""
    mlp, ball = _mlp(), bl.sets.L2Ball(RADIUS)
    return {
        x_set: (_x_problem(mlp, _model_forward, s), _x_problem(_plain(mlp), _plain_forward, s))
        for x_set, s in (("free", None), ("ball", ball))
    }


def _solver(name, problem, **extra):
    solver = bl.solvers.make(name, **settings(name) | {"batch_size": 4} | extra)
    solver.check_problem(problem)
    return solver.with_horizon(STEPS).resolve(problem)


def _trajectories(solver, problems, advance="step"):
    """``(x_t, y_t)`` for t = 1..STEPS of ``solver`` on each problem (leading step axis), all
    in one compiled program, every problem from the same key."""

    def run(key):
        out = []
        for problem in problems:

            def body(state, _, problem=problem):
                state = getattr(solver, advance)(problem, state)
                return state, solver.output(state)

            out.append(jax.lax.scan(body, solver.init(problem, key), None, length=STEPS)[1])
        return out

    key = jax.random.key(0)
    return jax.jit(run).lower(key).compile(compiler_options=QUICK_COMPILE)(key)


def _assert_same_steps(model_traj, plain_traj, model_problem):
    (x_m, y_m), (x_p, y_p) = model_traj, plain_traj
    # the solvers' x (and y) are the parameters: the model with None in place of its functions
    assert jax.tree.structure(x_m) == jax.tree.structure(model_problem.x0)
    assert jax.tree.structure(y_m) == jax.tree.structure(model_problem.y0)
    assert all(a.shape[0] == STEPS for a in jax.tree.leaves((x_m, y_m)))
    start = jax.tree.leaves(model_problem.x0)
    moved = [a[-1] - b for a, b in zip(jax.tree.leaves(x_m), start, strict=True)]
    assert any(np.abs(d).max() > 0 for d in moved)  # the solver did move x
    leaves_m, leaves_p = jax.tree.leaves((x_m, y_m)), jax.tree.leaves((x_p, y_p))
    assert len(leaves_m) == len(leaves_p)
    for a, b in zip(leaves_m, leaves_p, strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-300)


# ---- every solver --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", bl.solvers.names())
def test_an_mlp_as_x_takes_the_steps_of_its_arrays(name, x_pairs):
    model, plain = x_pairs["ball" if frank_wolfe(name) else "free"]
    solver = _solver(name, model)
    _assert_same_steps(*_trajectories(solver, (model, plain)), model)


@pytest.mark.parametrize("name", ["f2sa", "pzobo", "aid-cg"])
def test_an_mlp_as_y_takes_the_steps_of_its_arrays(name):
    mlp = _mlp(D, 1, seed=3)
    model, plain = _y_problem(mlp, _model_forward), _y_problem(_plain(mlp), _plain_forward)
    _assert_same_steps(*_trajectories(_solver(name, model), (model, plain)), model)


def _online(x0, forward):
    loss = _features_loss(forward)
    return bl.OnlineProblem(
        outer=lambda t, x, y, b: loss(x, y, b),
        inner=lambda t, x, y, b: loss(x, y, b) + 0.5 * MU * jnp.sum(y**2),
        horizon=STEPS,
        x0=x0,
        y0=jnp.zeros(K),
        outer_data=_data(1, rounds=STEPS),
        inner_data=_data(2, rounds=STEPS),
    )


@pytest.mark.parametrize("name", ["f2obo", "aobo", "sobow"])
def test_an_mlp_as_x_online(name):
    """OnlineProblem takes models too: a few online solvers (F2OBO's family, the HVP family,
    the window family) play the same rounds on the MLP as on its arrays."""
    mlp = _mlp()
    model, plain = _online(mlp, _model_forward), _online(_plain(mlp), _plain_forward)
    extra = {"f2obo": {"inner_steps": 5}, "aobo": {"tolerance": 0.1}}.get(name, {})  # not "auto"
    solver = bl.solvers.make(name, lr_outer=0.1, lr_inner=0.2, **extra)
    _assert_same_steps(*_trajectories(solver, (model, plain), advance="round"), model)


def test_solve_online_returns_models():
    model = _online(_mlp(), _model_forward)
    solver = bl.solvers.make("f2obo", lr_outer=0.1, lr_inner=0.2)
    res = bl.solve_online(model, solver, progress=False, regret=None, eval_every=STEPS)
    assert isinstance(res.x, eqx.nn.MLP) and isinstance(res.xs, eqx.nn.MLP)
    assert res.xs.layers[0].weight.shape == (STEPS, 3, D)
    assert res.xs.activation is model.model_parts[0].activation


# ---- the driver ------------------------------------------------------------------------------
def _perturbed(tree, key):
    """``tree`` with its float arrays scaled by a random factor in [0.9, 1.1] (a random start
    drawn per seed; one draw, which compiles faster than one per array)."""
    params, static = eqx.partition(tree, eqx.is_inexact_array)
    scale = jax.random.uniform(key, (), minval=0.9, maxval=1.1)
    return eqx.combine(jax.tree.map(lambda a: scale * a, params), static)


def _arrays(tree) -> list:
    return jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))


def test_solve_returns_models_and_runs_as_the_arrays(x_pairs, tmp_path):
    """Through ``bl.solve``: two seeds with a random start per seed (``init=`` returning a
    model), the same history as the plain arrays', ``res.x`` an MLP with the seed axis, and a
    checkpointed run resumed to the same end; ``bl.sweep`` over it."""
    model, plain = x_pairs["free"]
    mlp = model.models(model.x0, model.y0)[0]
    solver = bl.solvers.make("soba", **settings("soba"), batch_size=4)
    inits = {
        model: lambda key: (_perturbed(mlp, key), jnp.zeros(K)),
        plain: lambda key: (_perturbed(_plain(mlp), key), jnp.zeros(K)),
    }

    def run(problem, steps=STEPS, **kw):
        return bl.solve(
            problem,
            solver,
            steps,
            seeds=[0, 1],
            eval_every=1,
            progress=False,
            init=inits[problem],
            **kw,
        )

    res, ref = run(model), run(plain)
    assert isinstance(res.x, eqx.nn.MLP) and res.x.activation is mlp.activation
    assert res.x.layers[0].weight.shape == (2, 3, D) and res.x.layers[1].bias.shape == (2, K)
    cols = [c for c in ref.history.columns if c != "seconds"]
    assert list(res.history.columns) == list(ref.history.columns)
    np.testing.assert_allclose(
        res.history[cols].to_numpy(float), ref.history[cols].to_numpy(float), rtol=RTOL
    )
    for a, b in zip(_arrays((res.x, res.y)), _arrays((ref.x, ref.y)), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL)
    # bl.sweep: the point lr_outer = 0.05 (soba's setting) is the run above
    df = bl.sweep(
        model,
        "soba",
        grid={"lr_outer": [0.02, 0.05]},
        steps=STEPS,
        seeds=[0, 1],
        eval_every=1,
        progress=False,
        init=inits[model],
        lr_inner=0.1,
        batch_size=4,
    )
    point = df[df.lr_outer == 0.05].sort_values(["step", "seed"])
    # vmapped over grid points: another summation order
    np.testing.assert_allclose(point.outer_loss, res.history.outer_loss, rtol=1e-9)
    run(model, steps=1, checkpoint=tmp_path)
    resumed = run(model, checkpoint=tmp_path)
    assert resumed.message.startswith("resumed")
    for a, b in zip(_arrays(resumed.x), _arrays(res.x), strict=True):
        np.testing.assert_array_equal(a, b)


def test_x_set_with_a_model(x_pairs):
    """A constraint set acts on the model's arrays, leaf by leaf (a Box) or jointly (a ball),
    and a Frank-Wolfe method runs on it through ``bl.solve`` with the exact constrained
    metrics (dense hypergradients of the model problem)."""
    mlp = _mlp()
    with pytest.warns(UserWarning, match="x0 lies outside x_set=Box"):
        boxed = _x_problem(mlp, _model_forward, bl.sets.Box(-0.1, 0.1))
    for before, after in zip(jax.tree.leaves(_plain(mlp)), jax.tree.leaves(boxed.x0), strict=True):
        np.testing.assert_array_equal(after, np.clip(before, -0.1, 0.1))
    assert boxed.model_parts[0].activation is mlp.activation
    model, _ = x_pairs["ball"]
    res = bl.solve(model, _solver("ibcg", model), STEPS, eval_every=STEPS, progress=False)
    assert isinstance(res.x, eqx.nn.MLP)
    assert {"grad_mapping", "fw_gap"} <= set(res.history.columns)
    assert np.isfinite(res.history[["grad_mapping", "fw_gap"]].to_numpy()).all()
    params = eqx.filter(res.x, eqx.is_inexact_array)
    assert float(np.sqrt(_squares(params))) <= RADIUS * (1 + 1e-12)


def test_exact_hypergradient_of_a_model(x_pairs):
    """``bl.metrics.hypergradient`` takes the model whole and returns the parameters' gradient
    (None at the functions, as ``eqx.filter_grad``), equal to the plain arrays'."""
    model, plain = x_pairs["free"]
    mlp = model.models(model.x0, model.y0)[0]
    # one program; g is quadratic in y, so one Newton step solves the inner problem exactly
    grad, ref = jax.jit(
        lambda: (
            bl.metrics.hypergradient(model, mlp, newton_steps=1),
            bl.metrics.hypergradient(plain, plain.x0, newton_steps=1),
        )
    )()
    assert grad.activation is None and isinstance(grad.layers[0].weight, jax.Array)
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)


# ---- what is a parameter ---------------------------------------------------------------------
def test_functions_see_the_model_and_python_floats_are_constants():
    seen = []

    def outer(x, y, batch):
        seen.append((type(x["net"]), x["scale"], x["label"]))
        return x["scale"] * jnp.sum(jax.vmap(x["net"])(batch["a"]) @ y) + jnp.sum(x["w"] ** 2)

    x0 = {"net": _mlp(), "scale": 2.0, "label": "features", "w": jnp.ones(2)}
    problem = bl.BilevelProblem(
        outer=outer,
        inner=lambda x, y, b: jnp.sum(y**2),
        x0=x0,
        y0=jnp.zeros(K),
        outer_data=_data(1),
    )
    assert seen and all(s == (eqx.nn.MLP, 2.0, "features") for s in seen)
    # the solvers' x0: the five float arrays; None at the functions, the float and the string
    assert problem.x0["scale"] is None and problem.x0["label"] is None
    assert problem.x0["net"].activation is None
    assert len(jax.tree.leaves(problem.x0)) == 5
    x, _ = problem.models(problem.x0, problem.y0)
    assert x["scale"] == 2.0 and x["net"].activation is x0["net"].activation
    np.testing.assert_array_equal(problem.parameters(x0, None)[0]["w"], x0["w"])
    # a copy keeps the model's constants, and its functions are the user's, wrapped once
    copy = problem.replace(x_set=bl.sets.L2Ball(100.0))
    assert copy.model_parts[0] is problem.model_parts[0] and copy.outer.fn is outer


def test_an_integer_array_leaf_is_refused_by_its_path():
    mlp = eqx.tree_at(lambda m: m.layers[1].bias, _mlp(), jnp.zeros(K, jnp.int32))
    with pytest.raises(TypeError, match=r"x0=.*leaf \.layers\[1\]\.bias .*int32.*cannot be"):
        _x_problem(mlp, _model_forward)
    with pytest.raises(TypeError, match=r"OnlineProblem\(x0=.*\['n'\].*bool"):
        _online({"w": _mlp(), "n": np.array(True)}, lambda x, a: x["w"](a))


def test_a_start_without_float_arrays_is_refused():
    # a model (here: a function beside a Python float) needs a float array to optimise ...
    with pytest.raises(ValueError, match=r"y0=.*no float array.*Python ints and floats"):
        _x_problem(_mlp(), _model_forward).replace(y0={"lam": 1.0, "link": jnp.tanh})


def test_a_tree_of_numbers_is_all_parameters_as_before():
    # ... while a plain tree of numbers keeps the library's rule: every leaf is a parameter,
    # Python scalars and integer arrays cast to float (no model, so no equinox semantics)
    x0, static = split_model({"lam": 1.0, "k": np.arange(2)}, "x0")
    assert static is None and x0["lam"].dtype == jnp.float64 and x0["k"].dtype == jnp.float64
