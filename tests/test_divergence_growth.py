"""Runaway iterates are a divergence whatever the metrics say (issue #33).

Runs ended "completed 3000 steps" with |x| up to 4e40 and an exact ||grad F|| of 0: the
headline metric looked fine while the iterates ran away. The drivers now also call a seed
diverged when ||x|| or ||y|| grows beyond ``EXPLOSION_FACTOR`` x max(its start norm, 1)
(``bilevel.drivers.divergence.grown``).

The runaway problem below is built so that ONLY that rule can fire: f = -c sum(y) with
g = 1/2 ||y - x||^2 (y*(x) = x) is unbounded below along x, so a huge ``lr_outer`` moves x by
a constant ~lr_outer * c per step, while its headline metric -- the problem's exact
``grad_norm`` = c sqrt(2) -- stays constant and tiny, and every value stays finite.
"""

import dataclasses
import json
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.core.oracles import Counts
from bilevel.drivers.divergence import (
    EXPLOSION_FACTOR,
    ITERATES_GREW,
    Health,
    exploded,
    grown,
)
from bilevel.drivers.history import History

C = 1e-6  # the outer loss's slope: grad F = -C (1, 1)
RUNAWAY_LR = 8e16  # x moves by 8e10 per step: 0.8e12 at step 10, 1.2e12 (beyond 1e12) at 15
RUN = dict(steps=100, eval_every=5, progress=False)


def runaway_problem() -> bl.BilevelProblem:
    return bl.BilevelProblem(
        outer=lambda x, y, batch: -C * jnp.sum(y),
        inner=lambda x, y, batch: 0.5 * jnp.sum((y - x) ** 2),
        x0=jnp.ones(2),
        y0=jnp.ones(2),
        metrics=lambda x, y: {"grad_norm": C * jnp.sqrt(2.0) * jnp.ones(())},
        name="runaway",
    )


def solver(lr_outer: float = RUNAWAY_LR):
    # lr_outer always explicit: its default is to become tuned ("auto")
    return bl.solvers.make("aid-cg", lr_outer=lr_outer, lr_inner=0.5)


@pytest.fixture(scope="module")
def runaway():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = bl.solve(runaway_problem(), solver(), **RUN)
    return res, caught


def test_runaway_iterates_are_diverged_though_the_headline_metric_is_tiny(runaway):
    res, caught = runaway
    assert res.diverged == [0]
    warned = [w for w in caught if issubclass(w.category, bl.DivergenceWarning)]
    assert len(warned) == 1
    assert str(warned[0].message) == res.message
    assert "seed 0 by step 15" in res.message and ITERATES_GREW in res.message
    assert res.message.endswith("try smaller step sizes (lr_outer, lr_inner).")
    # only the iterate rule fired: every kept value is finite and the headline metric did not
    # move, so neither the finiteness nor the headline rule had anything to say
    hist = res.history
    assert np.isfinite(hist.select_dtypes("number").to_numpy()).all()
    np.testing.assert_allclose(hist.grad_norm, C * np.sqrt(2.0))
    rows = hist.to_dict("records")
    assert not exploded({"grad_norm": C * np.sqrt(2.0)}, 15, [0], rows).any()


def test_the_history_and_iterates_stop_at_the_last_good_evaluation(runaway):
    res, _ = runaway
    assert list(res.history.step) == [0, 5, 10]
    x = np.asarray(res.x)
    assert np.isfinite(x).all()
    assert 1e11 < np.linalg.norm(x) < EXPLOSION_FACTOR * np.sqrt(2.0)  # grown, not yet beyond
    good = bl.solve(runaway_problem(), solver(), steps=10, eval_every=5, progress=False)
    assert good.diverged == []
    np.testing.assert_array_equal(x, np.asarray(good.x))


def test_a_normal_run_is_not_flagged():
    problem = bl.problems.quadratic(dx=3, dy=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.DivergenceWarning)
        res = bl.solve(
            problem, bl.solvers.make("aid-cg", lr_outer=0.05, lr_inner=0.1), seeds=[0, 1], **RUN
        )
    assert res.diverged == []
    assert res.message == "completed 100 steps"
    assert sorted(res.history.step.unique()) == list(range(0, 101, 5))


def test_the_iterate_norms_are_not_history_columns(runaway):
    """The norms travel in the evaluation's health, not as new columns (those are compared)."""
    res, _ = runaway
    assert not any("norm_x" in c or "x_norm" in c for c in res.history.columns)


def test_a_sweep_lists_the_point_whose_iterates_ran_away():
    df = bl.sweep(
        runaway_problem(),
        "aid-cg",
        grid={"lr_outer": [0.1, RUNAWAY_LR]},
        lr_inner=0.5,
        seeds=[0, 1],
        **RUN,
    )
    assert df.attrs["diverged"] == [
        {"lr_outer": RUNAWAY_LR, "seed": 0},
        {"lr_outer": RUNAWAY_LR, "seed": 1},
    ]
    calm, wild = df[df.lr_outer == 0.1], df[df.lr_outer == RUNAWAY_LR]
    assert calm.step.max() == 100
    assert sorted(wild.step.unique()) == [0, 5, 10]


def test_the_rule_measures_growth_from_the_start_norm_floored_at_one():
    """A start at 0 (a common y0) counts as 1; a large start is its own scale."""
    start = np.array([[0.0, 0.0], [1e6, 1.0]])
    assert not grown(np.array([[0.9e12, 0.0], [0.9e18, 1.0]]), start).any()
    assert grown(np.array([[0.0, 1.1e12], [1.1e18, 1.0]]), start).all()


def test_history_takes_the_first_norms_as_the_start_and_keeps_the_reason():
    history = History([3, 4])
    zero = Counts(*(np.zeros(2, np.int32) for _ in Counts._fields))
    metrics = {"outer_loss": np.array([1.0, 1.0])}
    both = np.array([True, True])
    assert history.record(metrics, zero, Health(both, np.ones((2, 2))), 0, 0.0).all()
    norms = np.array([[2e12, 1.0], [1.0, 1.0]])
    assert history.record(metrics, zero, Health(both, norms), 5, 0.0).tolist() == [False, True]
    assert history.reasons == [ITERATES_GREW, None]
    # a plain finiteness array (what bl.solve_online's rounds pass) skips the iterate rule
    assert history.record(metrics, zero, both, 10, 0.0).all()
    # a checkpoint keeps the start norms and the reasons
    resumed = History([3, 4])
    resumed.restore(json.loads(json.dumps(history.meta())), list(history.rows))
    np.testing.assert_array_equal(resumed.start_norms, np.ones((2, 2)))
    assert resumed.reasons == history.reasons


def test_a_runaway_internal_iterate_is_diverged_though_x_and_y_stay_put():
    """IBCG's adjoint iterate w at a step 2.5 / L_g: ``w_{k+1} = w_k - eta (H w_k - grad_y f)``
    grows 1.5x a step while x stays in its box and y converges, so ||x|| and ||y|| say nothing;
    the hypergradient estimate ``grad_x f - d2g/dxdy w`` that w feeds does."""
    problem = bl.problems.quadratic(dx=3, dy=4).replace(x_set=bl.sets.Box(-1.0, 1.0))
    L_g = bl.diagnose(problem).L_g
    ibcg = bl.solvers.make("ibcg", lr_outer=0.1, lr_inner=1 / L_g, lr_adjoint=2.5 / L_g)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        res = bl.solve(problem, ibcg, steps=300, eval_every=10, progress=False)
    assert res.diverged == [0] and ITERATES_GREW in res.message
    x = np.asarray(res.x)
    assert np.isfinite(x).all() and np.abs(x).max() <= 1.0
    assert res.history.step.iloc[-1] < 300
    fine = dataclasses.replace(ibcg, lr_adjoint=1 / L_g)
    assert bl.solve(problem, fine, steps=300, eval_every=10, progress=False).diverged == []
