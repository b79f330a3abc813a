"""``lr_outer="auto"``: the tuning run of ``bl.solve`` / ``bl.tune`` (bilevel.drivers.tuning).

On the closed-form quadratic (``bl.problems.quadratic()``: its ``grad_norm`` metric is exact),
a default solve must tune, choose a step from its grid, count the tuning's samples in the
history, converge, and be reproducible; the choice rule is checked on synthetic trials.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.drivers import tuning as tuning_module
from bilevel.drivers import tuning_runs as runs
from bilevel.experiments.common import paper_solver

STEPS = 600


@pytest.fixture(scope="module")
def quadratic():
    return bl.problems.quadratic()


@pytest.fixture(scope="module")
def tuned_run(quadratic):
    return bl.solve(quadratic, bl.solvers.make("aid-cg"), steps=STEPS, progress=False)


def test_default_solve_tunes_and_converges(tuned_run):
    tuning = tuned_run.tuning
    assert isinstance(tuning, bl.Tuning)
    assert tuning.field == "lr_outer"
    assert tuning.value in tuning.grid
    assert tuning.steps == tuning_module.tuning_steps(STEPS) == 50
    assert tuning.score == "grad_norm"  # the problem's own exact metric
    assert tuned_run.solver.lr_outer == tuning.value
    h = tuned_run.history
    # the closed-form ||grad F|| falls by far more than the 10x in 600 steps
    assert h["grad_norm"].iloc[-1] <= 0.1 * h["grad_norm"].iloc[0]
    assert tuned_run.ok


def test_tuning_counts_are_in_the_history(quadratic, tuned_run):
    tuning = tuned_run.tuning
    first = tuned_run.history.iloc[0]
    assert first["step"] == 0
    assert first["samples"] == tuning.samples
    assert first["oracle_calls"] == tuning.oracle_calls > 0
    # the run itself is the fixed-step run with the chosen value: the same iterates, and the
    # counts differ by exactly the tuning's
    again = bl.solve(
        quadratic, bl.solvers.make("aid-cg", lr_outer=tuning.value), steps=STEPS, progress=False
    )
    assert again.tuning is None
    np.testing.assert_array_equal(np.asarray(again.x), np.asarray(tuned_run.x))
    delta = tuned_run.history["oracle_calls"].to_numpy() - again.history["oracle_calls"].to_numpy()
    assert np.all(delta == tuning.oracle_calls)


def test_with_minibatches_a_constant_step_takes_a_tenth_in_the_second_half():
    """Point 6 of bilevel.drivers.tuning: on a run that draws minibatches, the tuned step of a
    method with a constant outer step becomes ``TailDecay(value, steps / 2, 0.1)``, recorded in
    ``res.tuning.tail`` and retraced by ``lr_outer=res.tuning.step``; a method whose own
    schedule decays its step (F2SA) and a full-batch run keep the plain value."""
    noisy = bl.problems.quadratic(dx=3, dy=5, stochastic=True, n_samples=64)
    steps = 200
    res = bl.solve(noisy, bl.solvers.make("stocbio", batch_size=16), steps=steps, progress=False)
    tuning = res.tuning
    assert tuning.tail == (100.0, 0.1) == (steps * tuning_module.TAIL_START, 0.1)
    assert res.solver.lr_outer == tuning.step == bl.schedules.TailDecay(tuning.value, 100, 0.1)
    assert "x0.1 from step 100 (minibatches)" in tuning.summary()
    again = bl.solve(
        noisy,
        bl.solvers.make("stocbio", batch_size=16, lr_outer=tuning.step),
        steps=steps,
        progress=False,
    )
    np.testing.assert_array_equal(np.asarray(again.x), np.asarray(res.x))
    assert bl.tune(noisy, bl.solvers.make("f2sa", batch_size=16), steps).tail is None
    assert bl.tune(noisy, bl.solvers.make("stocbio"), steps).tail is None  # full batches


def test_same_seed_same_choice(quadratic, tuned_run):
    again = bl.tune(quadratic, "aid-cg", STEPS)
    assert again.value == tuned_run.tuning.value
    assert again.scores == tuned_run.tuning.scores
    table = again.table()
    assert list(table["lr_outer"]) == list(again.grid)
    assert table["chosen"].sum() == 1


def test_tuning_by_exact_gradient_of_user_problem():
    """A problem without closed-form metrics (a per-feature ridge penalty) is scored by the
    exact hypergradient norm the tuning adds, and converges by 10x."""
    problem = _ridge(seed=3)
    res = bl.solve(problem, bl.solvers.make("f2sa"), steps=1500, progress=False)
    assert res.tuning.score == "grad_norm"
    g0 = float(jnp.linalg.norm(bl.metrics.hypergradient(problem, problem.x0)))
    g = float(jnp.linalg.norm(bl.metrics.hypergradient(problem, res.x)))
    assert res.ok and g <= 0.1 * g0


def _ridge(seed: int, n: int = 240, d: int = 5):
    """Ridge regression with a per-feature penalty exp(x_j) w_j^2, tuned on validation data."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    Y = X @ np.linspace(-1.5, 1.5, d) + 0.5 * rng.normal(size=n)
    train = {"X": jnp.asarray(X[: n // 2]), "Y": jnp.asarray(Y[: n // 2])}
    val = {"X": jnp.asarray(X[n // 2 :]), "Y": jnp.asarray(Y[n // 2 :])}

    def inner(x, w, b):
        return jnp.mean((b["X"] @ w - b["Y"]) ** 2) + jnp.sum(jnp.exp(x) * w**2)

    def outer(x, w, b):
        return jnp.mean((b["X"] @ w - b["Y"]) ** 2)

    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros(d),
        y0=jnp.zeros(d),
        outer_data=val,
        inner_data=train,
        name="ridge-exp",
    )


# ---- the choice rule -------------------------------------------------------------------------
def _trial(scores, dropped):
    grid = tuning_module.GRID[: len(scores)]
    counts = dict.fromkeys(("samples", "oracle_calls", *bl.oracles.Counts._fields), 0)
    return tuning_module.Trial(grid, list(scores), 1.0, list(dropped), counts)


def _decide(scores, dropped):
    solver = bl.solvers.make("aid-cg")
    return tuning_module._decide(_trial(scores, dropped), solver, "grad_norm", 50, 0.0)


def test_edge_of_stability_is_not_chosen():
    inf = math.inf
    # the best score is at the largest stable candidate, whose neighbour diverged: one below
    choice = _decide([0.9, 0.5, 0.2, 0.05, inf], ["", "", "", "", "diverged"])
    assert choice.value == tuning_module.GRID[2]
    assert choice.largest_stable == tuning_module.GRID[3]
    assert choice.table()["chosen"].sum() == 1


def test_when_every_kept_candidate_is_at_the_edge_the_best_of_them_is_chosen():
    inf = math.inf
    # the only kept candidate sits between a slower one (dropped as behind) and a diverged one:
    # it is chosen, not the dropped one below it (bl.solve retries smaller should it diverge)
    choice = _decide([inf, inf, 0.02, inf, inf], ["F behind", "F behind", "", "no progress",
                                                  "diverged"])  # fmt: skip
    assert choice.value == tuning_module.GRID[2]
    assert choice.largest_stable == tuning_module.GRID[2]
    # two edge candidates (each one's next larger dropped): the better one
    choice = _decide([0.5, inf, 0.1, inf], ["", "no progress", "", "diverged"])
    assert choice.value == tuning_module.GRID[2]


def test_a_larger_candidate_behind_in_f_is_no_edge_of_stability():
    inf = math.inf
    # the next larger one ran stably to a worse F: the best is safe and chosen
    choice = _decide([0.9, 0.5, 0.2, inf], ["", "", "", "F behind"])
    assert choice.value == tuning_module.GRID[2]
    # one that made no progress marks an edge, as a divergence does: the safe one below
    choice = _decide([0.9, 0.5, 0.2, inf], ["", "", "", "no progress"])
    assert choice.value == tuning_module.GRID[1]


def test_next_larger_candidate_within_near_factor():
    choice = _decide([0.9, 0.3, 0.4, 0.8, 0.9], [""] * 5)
    assert choice.value == tuning_module.GRID[2]  # 0.4 <= 1.5 x 0.3
    choice = _decide([0.9, 0.3, 0.5, 0.8, 0.9], [""] * 5)
    assert choice.value == tuning_module.GRID[1]


def test_all_dropped_names_lr_inner():
    with pytest.raises(bl.TuningError, match="lr_inner"):
        _decide([math.inf] * 3, ["diverged"] * 3)


def _raw_trial(grid, reached, reasons, final_F, start_F=1.0):
    """A sweep as ``trial`` builds it before judging: each candidate's own drop reason, the
    score it reached and its final exact F."""
    counts = dict.fromkeys(("samples", "oracle_calls", *bl.oracles.Counts._fields), 0)
    scores = [math.inf if r else v for v, r in zip(reached, reasons, strict=True)]
    return tuning_module.Trial(tuple(grid), scores, 1.0, list(reasons), counts, list(reasons),
                               list(reached), list(final_F), start_F)  # fmt: skip


def test_an_extended_grid_is_judged_with_the_first():
    """Measured on a digits 3-vs-8 logistic regression with one log-penalty (F2SA, full batch):
    the first grid's best was its largest (100), so the grid was extended upwards, and there
    every candidate ran to x = -37 ... -118, where exp(x) vanishes: ||grad F|| 3e-4 ... 7e-150,
    F above its start (no progress). Judged alone, the extension kept them (no candidate of
    its own improved) and 1e3 was chosen; its run diverged, as did the retry's. Judged with
    the first grid, they stay dropped, and so does an extension candidate whose F is behind
    the first grid's best."""
    first = runs.settle(
        _raw_trial([1.0, 10.0, 100.0], [0.02, 0.013, 0.006], ["", "", ""], [0.08, 0.064, 0.077])
    )
    assert first.dropped == ["", "", ""]
    upper = runs.settle(  # as trial() returns it: judged alone
        _raw_trial([316.0, 1e3, 3e3], [3e-4, 3e-39, 7e-150], ["no progress"] * 3, [4.4] * 3)
    )
    assert upper.dropped == ["", "", ""]  # alone: none improved, all kept
    merged = runs.merge([first, upper])
    assert merged.grid == (1.0, 10.0, 100.0, 316.0, 1e3, 3e3)
    assert merged.dropped == ["", "", ""] + ["no progress"] * 3
    assert tuning_module._decide(merged, bl.solvers.make("f2sa"), "grad_norm", 50, 0.0).value < 316
    # kept by its own run, but its F is far behind the first grid's best: dropped in the union
    behind = runs.settle(_raw_trial([316.0], [1e-9], [""], [0.9]))
    assert behind.dropped == [""]
    assert runs.merge([first, behind]).dropped == ["", "", "", "F behind"]
    # no candidate of either grid improved: the stable ones are kept, scored as they reached
    stuck = runs.merge([
        runs.settle(_raw_trial([1.0, 10.0], [0.5, 0.4], ["no progress", "diverged"], [1.1, 1.2])),
        runs.settle(_raw_trial([1e-4], [0.6], ["no progress"], [1.05])),
    ])  # fmt: skip
    assert stuck.dropped == ["", "", "diverged"] and stuck.scores[:2] == [0.6, 0.5]


def test_progress_is_judged_by_F_where_the_run_knows_it():
    """Leaving a flat start, ||grad F|| rises while F falls: progress. Running into a region
    where the gradient vanishes, ||grad F|| falls while F rises: none. Without F, the score."""
    import pandas as pd

    def rows(grad, F=None):
        out = {"step": [0, 50], "grad_norm": grad}
        return pd.DataFrame(out if F is None else {**out, "F": F})

    assert runs._drop_reason(rows([0.005, 0.05], [0.12, 0.04]), False, "grad_norm", 50) == ""
    leaving = rows([0.005, 1e-40], [0.12, 0.125])
    assert runs._drop_reason(leaving, False, "grad_norm", 50) == "no progress"
    assert runs._drop_reason(rows([0.005, 0.05]), False, "grad_norm", 50) == "no progress"
    assert runs._drop_reason(rows([0.05, 0.005]), False, "grad_norm", 50) == ""


def test_a_default_solve_leaves_a_flat_start_for_x_star_not_a_vanishing_gradient():
    """y*(x) = sigmoid(log(EPS) - x) (g = 1/2 (EPS (w - 1)^2 + exp(x) w^2), f = 1/2 (w -
    1/2)^2): F is flat at x0 = 0 (||grad F|| = 0.005), x* = log(EPS), and as x -> -inf
    ||grad F|| vanishes while F rises above F(x0). Every tuning candidate's ||grad F|| rose on
    its way to x*, so when that counted as "no progress" none was kept, all were kept as they
    were, and the saturated one with the smallest gradient won: SOBA ran to x = -4901
    (||grad F|| = 0 and F behind its start). Judged by F, the candidates heading for x* are
    kept and the default run converges there (a deterministic problem: to rounding)."""
    eps = 0.01

    def inner(x, w, _):
        return 0.5 * jnp.sum(eps * (w - 1.0) ** 2 + jnp.exp(x) * w**2)

    def outer(x, w, _):
        return 0.5 * jnp.sum((w - 0.5) ** 2)

    problem = bl.BilevelProblem(outer=outer, inner=inner, x0=jnp.zeros(1), y0=jnp.zeros(1))
    res = bl.solve(problem, bl.solvers.make("soba"), 1000, progress=False)
    assert res.ok
    assert float(res.x[0]) == pytest.approx(math.log(eps), abs=1e-6)


# ---- where "auto" may not go -----------------------------------------------------------------
def test_init_without_tuning_says_how(quadratic):
    solver = bl.solvers.make("stocbio").resolve(quadratic)
    with pytest.raises(ValueError, match="bl.tune"):
        solver.init(quadratic, jax.random.PRNGKey(0))


def test_sweep_refuses_auto_lr_outer_outside_the_grid(quadratic):
    with pytest.raises(ValueError, match="put lr_outer in grid"):
        bl.sweep(quadratic, "aid-cg", grid={"lr_inner": [0.05, 0.1]}, steps=10, progress=False)


def test_reproductions_never_tune():
    with pytest.raises(ValueError, match="paper's"):
        paper_solver("f2sa", lr_inner=0.1)
    assert paper_solver("f2sa", lr_outer=0.1).lr_outer == 0.1


def test_frank_wolfe_steps_follow_their_paper():
    # IBCG's "auto" gamma is its paper's rule of the horizon, not a tuning run
    assert bl.solvers.make("ibcg").untuned() == []
    assert dataclasses.replace(bl.solvers.make("stocbio"), lr_outer=0.1).untuned() == []


def test_a_tuned_step_that_diverges_in_the_run_is_retried_smaller(quadratic, monkeypatch):
    """The run with the chosen step diverges: bl.solve runs again with the next smaller
    candidate, says so in ``res.tuning.retries`` and counts the diverged run's work."""
    import bilevel.drivers.solve as solve_module

    grid = (0.01, 0.1, 1e4)
    fake = tuning_module.Tuning(
        field="lr_outer", value=1e4, grid=grid, scores=(1.0, 0.5, 0.1), dropped=("", "", ""),
        score="grad_norm", start_score=2.0, steps=10, samples=0, oracle_calls=0,
        counts=dict.fromkeys(bl.oracles.Counts._fields, 0), seconds=0.0, largest_stable=1e4,
    )  # fmt: skip
    monkeypatch.setattr(solve_module, "tune", lambda *a, **k: fake)
    res = bl.solve(quadratic, bl.solvers.make("aid-cg"), steps=200, progress=False)
    assert res.ok
    assert res.tuning.retries == (1e4,) and res.tuning.value == 0.1
    assert res.tuning.retry_reasons == ("diverged",)
    fixed = bl.solve(quadratic, bl.solvers.make("aid-cg", lr_outer=0.1), 200, progress=False)
    np.testing.assert_array_equal(np.asarray(res.x), np.asarray(fixed.x))
    assert res.tuning.oracle_calls > 0  # the diverged run's calls
    delta = res.history["oracle_calls"].to_numpy() - fixed.history["oracle_calls"].to_numpy()
    assert np.all(delta == res.tuning.oracle_calls)


def _fake_tuning(value, grid, scores):
    return tuning_module.Tuning(
        field="lr_outer", value=value, grid=grid, scores=scores, dropped=("",) * len(grid),
        score="grad_norm", start_score=2.0, steps=10, samples=0, oracle_calls=0,
        counts=dict.fromkeys(bl.oracles.Counts._fields, 0), seconds=0.0, largest_stable=value,
    )  # fmt: skip


def test_a_retry_skips_candidates_that_diverged_in_the_tuning():
    """The retry's (and the message's) next smaller step is one the tuning run found stable:
    on the digits logistic regression of ``test_an_extended_grid_is_judged_with_the_first``,
    31.6 had diverged within the tuning's 150 steps, yet the message proposed it."""
    from bilevel.drivers.solve import _smaller

    grid = (1.0, 10.0, 31.6, 100.0)
    tuning = dataclasses.replace(
        _fake_tuning(100.0, grid, (0.02, 0.013, math.inf, 0.006)),
        dropped=("", "", "diverged", ""),
    )
    assert _smaller(tuning) == 10.0
    assert _smaller(dataclasses.replace(tuning, value=1.0)) == 0.1  # none below: a tenth


def test_a_run_that_ends_worse_than_its_tuning_run_is_retried_smaller(quadratic, monkeypatch):
    """Drift: the full run with the chosen step ends with a larger ||grad F|| than the tuning
    run of that step reached (here a tuning score no run can beat), so bl.solve runs again with
    the next smaller candidate; that one's run ends below its own tuning score: no more
    retries. Of the two full runs, the one that ended lower is returned: here the retry (0.2
    is past this quadratic's stable steps: ||grad F|| 681 after 100 steps, 0.1's 2.6e-6)."""
    import bilevel.drivers.solve as solve_module

    fake = _fake_tuning(0.2, (0.1, 0.2), (10.0, 1e-30))
    monkeypatch.setattr(solve_module, "tune", lambda *a, **k: fake)
    res = bl.solve(quadratic, bl.solvers.make("aid-cg"), steps=100, progress=False)
    assert res.ok and res.tuning.retries == (0.2,) and res.tuning.value == 0.1
    assert res.tuning.retry_reasons == ("drifted",)
    assert "0.2 drifted in the run" in res.tuning.summary()
    assert "ran with 0.1" in res.tuning.summary()
    finals = res.tuning.finals
    assert len(finals) == 2 and finals[0] > 100.0 and finals[1] < 1e-4
    fixed = bl.solve(quadratic, bl.solvers.make("aid-cg", lr_outer=0.1), 100, progress=False)
    np.testing.assert_array_equal(np.asarray(res.x), np.asarray(fixed.x))


def test_after_retries_the_run_that_ended_lowest_is_returned(quadratic, monkeypatch):
    """0.1 drifts by its (unbeatable) tuning score yet ends at ||grad F|| 2.6e-6; the retry
    with 0.01 ends at 0.18. The 0.1 run is returned, its history counting the retry's work
    too, and the summary says why."""
    import bilevel.drivers.solve as solve_module

    fake = _fake_tuning(0.1, (0.01, 0.1), (10.0, 1e-30))
    monkeypatch.setattr(solve_module, "tune", lambda *a, **k: fake)
    res = bl.solve(quadratic, bl.solvers.make("aid-cg"), steps=100, progress=False)
    assert res.ok and res.tuning.retries == (0.1,) and res.tuning.value == 0.1
    finals = res.tuning.finals
    assert finals[0] < 1e-4 < 0.1 < finals[1]
    assert "returned the run with 0.1" in res.tuning.summary()
    assert res.tuning.step == 0.1  # retraces the returned run
    fixed = bl.solve(quadratic, bl.solvers.make("aid-cg", lr_outer=0.1), 100, progress=False)
    np.testing.assert_array_equal(np.asarray(res.x), np.asarray(fixed.x))
    retry = bl.solve(quadratic, bl.solvers.make("aid-cg", lr_outer=0.01), 100, progress=False)
    # the tuning itself counted nothing (a fake): every row holds the retry's whole run more
    for column in ("samples", "oracle_calls", *bl.oracles.Counts._fields):
        extra = res.history[column].to_numpy() - fixed.history[column].to_numpy()
        assert np.all(extra == retry.history[column].iloc[-1]), column
    assert retry.history["oracle_calls"].iloc[-1] > 0


def test_a_run_that_ends_at_or_below_its_tuning_score_is_kept(quadratic, monkeypatch):
    import bilevel.drivers.solve as solve_module

    fake = _fake_tuning(0.1, (0.01, 0.1), (10.0, 10.0))
    monkeypatch.setattr(solve_module, "tune", lambda *a, **k: fake)
    res = bl.solve(quadratic, bl.solvers.make("aid-cg"), steps=100, progress=False)
    assert res.tuning.retries == () and res.tuning.value == 0.1


def test_drift_is_judged_on_the_exact_gradient_where_the_run_did_not_record_it():
    """A user problem without a ``grad_norm`` metric: the final score is the exact
    ``||grad F(x)||`` at the run's last x (bl.metrics.hypergradient), per seed."""
    problem = _ridge(seed=3)
    res = bl.solve(
        problem, bl.solvers.make("f2sa", lr_outer=0.1), steps=50, seeds=[0, 1], progress=False
    )
    assert "grad_norm" not in res.history
    score = tuning_module.final_score(problem, res, "grad_norm", seed_axis=True)
    per_seed = [
        float(jnp.linalg.norm(bl.metrics.hypergradient(problem, res.x[i]))) for i in range(2)
    ]
    assert score == pytest.approx(np.mean(per_seed), rel=1e-12)
    fake = _fake_tuning(0.1, (0.01, 0.1), (1.0, score / 2))
    assert tuning_module.drifted(problem, res, fake, score)
    fake = _fake_tuning(0.1, (0.01, 0.1), (1.0, score * 1.01))
    assert not tuning_module.drifted(problem, res, fake, score)


def test_a_run_well_above_its_own_lowest_score_has_drifted():
    """The path rule (bilevel.drivers.retries): past the tuning's horizon the run had reached a
    score whose double its end exceeds, so it drifted, however high its tuning score (here one
    no run can miss); not when it ended below 1% of the start's score (2.0 in the fake)."""
    from bilevel.drivers.retries import PATH_DRIFT, SETTLED, drifted

    problem = _ridge(seed=3)
    res = bl.solve(problem, bl.solvers.make("f2sa", lr_outer=0.1), steps=20, progress=False)
    fake = _fake_tuning(0.1, (0.01, 0.1), (1.0, 1e30))
    assert (PATH_DRIFT, SETTLED) == (2.0, 0.01)
    assert drifted(problem, res, fake, final=0.5, lowest=0.2)
    assert not drifted(problem, res, fake, final=0.5, lowest=0.3)  # within 2x of its lowest
    assert not drifted(problem, res, fake, final=0.015, lowest=0.001)  # below 0.01 * 2.0
    assert not drifted(problem, res, fake, final=0.5)  # no path scores: the tuning's rule only


def test_path_scores_are_the_exact_scores_past_the_tuning_horizon(quadratic, monkeypatch):
    """``PathScores`` keeps the lowest mean exact ||grad F|| at the chunk ends strictly between
    the tuning's horizon and the last step: here steps 30 and 40 of a 50-step run (eval every
    10, tuning horizon 20), each the exact ||grad F|| of a run stopped there. A problem that
    records ``grad_norm`` itself (the quadratic) has it read from the history instead."""
    from bilevel.drivers.engine import Engine
    from bilevel.drivers.retries import PathScores

    fake = dataclasses.replace(_fake_tuning(0.05, (0.05,), (1.0,)), steps=20)
    seen = []
    original = Engine.__init__

    def spy(self, *args, watch=None, **kwargs):  # what a PathScores of this run sees
        watch = PathScores(args[0], args[1], fake, 50)
        seen.append(watch)
        original(self, *args, watch=watch, **kwargs)

    monkeypatch.setattr(Engine, "__init__", spy)
    ridge = _ridge(seed=3)
    solver = bl.solvers.make("aid-cg", lr_outer=0.05, lr_inner=0.05)
    bl.solve(ridge, solver, steps=50, eval_every=10, progress=False)
    monkeypatch.setattr(Engine, "__init__", original)
    exact = [
        float(jnp.linalg.norm(bl.metrics.hypergradient(
            ridge, bl.solve(ridge, solver, steps=k, progress=False).x)))
        for k in (30, 40)
    ]  # fmt: skip
    assert not seen[0].recorded
    assert seen[0].lowest == pytest.approx(min(exact), rel=1e-9)
    path = PathScores(quadratic, solver, fake, 50)
    assert path.recorded
    res = bl.solve(quadratic, solver, steps=50, eval_every=10, progress=False)
    rows = res.history[res.history["step"].isin([30, 40])]
    assert path.lowest_in(res) == rows["grad_norm"].min()


def test_a_run_that_drifted_on_its_path_is_retried_smaller(quadratic, monkeypatch):
    """The path rule wired into bl.solve: a run whose path had a far lower score than its end
    (here PathScores reports one) runs again with the next smaller candidate."""
    import bilevel.drivers.retries as retries_module
    import bilevel.drivers.solve as solve_module

    fake = _fake_tuning(0.1, (0.01, 0.1), (10.0, 10.0))  # the tuning's rule does not fire
    monkeypatch.setattr(solve_module, "tune", lambda *a, **k: fake)
    monkeypatch.setattr(retries_module.PathScores, "lowest_in", lambda self, result: 1e-12)
    monkeypatch.setattr(retries_module, "SETTLED", 0.0)
    res = bl.solve(quadratic, bl.solvers.make("aid-cg"), steps=100, progress=False)
    assert res.tuning.retries[0] == 0.1 and res.tuning.retry_reasons[0] == "drifted"


def test_summary_of_a_choice_without_a_score_says_why():
    """The step below an edge-of-stability candidate can itself have been dropped for making no
    progress: its score is inf, and the summary says so instead of printing '-> inf'."""
    t = bl.Tuning(
        field="lr_outer",
        value=0.1,
        grid=(0.1, 1.0, 10.0),
        scores=(math.inf, 0.5, math.inf),
        dropped=("no progress", "", "diverged"),
        score="grad_norm",
        start_score=2.0,
        steps=150,
        samples=0,
        oracle_calls=0,
        counts={},
        seconds=1.0,
        largest_stable=1.0,
    )
    line = t.summary()
    assert "-> no score (no progress)" in line and "inf" not in line
    assert "1 of 3 candidates" in line
