"""``bl.sweep`` (issue #12): a grid of numeric hyperparameters x seeds as one vmapped program,
whose rows are those of separate ``bl.solve`` runs."""

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import bilevel as bl
from bilevel.cli import app

GRID = {"lr_outer": [0.01, 0.05], "lr_inner": [0.1, 0.2]}
RUN = dict(seeds=range(3), steps=60, eval_every=20, batch_size=16, progress=False)
SOLVE_COLUMNS = [
    "seed",
    "step",
    "samples",
    "samples_outer",
    "samples_inner",
    "oracle_calls",
    "seconds",
    "outer_loss",
    "inner_grad_norm",
    "hypergrad_estimate_norm",
]


@pytest.fixture(scope="module")
def problem():
    return bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=64)


@pytest.fixture(scope="module")
def swept(problem):
    return bl.sweep(problem, "f2sa", grid=GRID, **RUN)


def test_one_row_per_point_seed_and_evaluation_with_solve_columns(swept):
    assert len(swept) == 4 * 3 * 4  # 2 x 2 points, 3 seeds, evaluations at 0, 20, 40, 60
    assert list(swept.columns[:2]) == ["lr_outer", "lr_inner"]
    assert set(SOLVE_COLUMNS + ["grad_norm", "x_err"]) <= set(swept.columns)
    points = swept.groupby(["lr_outer", "lr_inner"]).size()
    assert points.to_dict() == {(a, b): 12 for a in GRID["lr_outer"] for b in GRID["lr_inner"]}
    assert sorted(swept["step"].unique()) == [0, 20, 40, 60]
    assert swept.attrs["diverged"] == []
    final = swept[swept.step == 60].groupby(["lr_outer", "lr_inner"])["x_err"].mean()
    assert final.nunique() == 4, "every point ran its own step sizes"


@pytest.mark.parametrize("point", [(0.01, 0.2), (0.05, 0.1)])
def test_a_point_equals_a_separate_solve(problem, swept, point):
    """The point's rows are ``bl.solve``'s with that point's solver. Counters are exact; the
    metrics agree to 1e-12 relative, not bitwise: the extra vmap over grid points makes XLA
    batch the float64 reductions differently (measured ~1e-14 after 60 steps)."""
    lr_outer, lr_inner = point
    solver = bl.solvers.make("f2sa", lr_outer=lr_outer, lr_inner=lr_inner, batch_size=16)
    run = {k: v for k, v in RUN.items() if k != "batch_size"}
    expected = bl.solve(problem, solver, **run).history
    expected = expected.sort_values(["seed", "step"]).reset_index(drop=True)
    got = swept[(swept.lr_outer == lr_outer) & (swept.lr_inner == lr_inner)]
    got = got.reset_index(drop=True)[expected.columns]
    for column in expected.columns.drop("seconds"):
        if pd.api.types.is_integer_dtype(expected[column]):
            np.testing.assert_array_equal(got[column], expected[column], err_msg=column)
        else:
            np.testing.assert_allclose(got[column], expected[column], rtol=1e-12, err_msg=column)


def test_a_diverging_point_keeps_its_rows_and_the_others_match_solve(problem):
    """A point that blows up stops (its seeds keep their last finite rows) while the PRNG key
    its neighbours share moves on: the healthy point still equals its own ``bl.solve``."""
    grid = {"lr_outer": [0.02, 1e4]}
    run = dict(seeds=[0, 1], steps=60, eval_every=20, progress=False)
    df = bl.sweep(problem, "stocbio", grid=grid, batch_size=16, **run)
    assert df.attrs["diverged"] == [{"lr_outer": 1e4, "seed": 0}, {"lr_outer": 1e4, "seed": 1}]
    assert df[df.lr_outer == 1e4].step.max() < 60  # stopped at its last finite evaluation
    solver = bl.solvers.make("stocbio", lr_outer=0.02, batch_size=16)
    expected = bl.solve(problem, solver, **run).history.sort_values(["seed", "step"])
    got = df[df.lr_outer == 0.02].reset_index(drop=True)
    np.testing.assert_allclose(got["x_err"], expected["x_err"].to_numpy(), rtol=1e-12)


def test_a_random_adjoint_draws_the_same_numbers_as_solve(problem):
    """TTSA's randomised Neumann product splits a key per step: shared across points, each
    point still sees exactly the draws (and Hessian-product counts) of its own solve."""
    grid = {"lr_outer": [0.01, 0.03]}
    run = dict(seeds=[0, 1], steps=40, eval_every=20, progress=False)
    hyper = dict(batch_size=16, hessian_inverse="random", neumann_steps=5)
    df = bl.sweep(problem, "ttsa", grid=grid, **hyper, **run)
    for lr in grid["lr_outer"]:
        solver = bl.solvers.make("ttsa", lr_outer=lr, **hyper)
        expected = bl.solve(problem, solver, **run).history.sort_values(["seed", "step"])
        got = df[df.lr_outer == lr].reset_index(drop=True)
        np.testing.assert_array_equal(got["oracle_calls"], expected["oracle_calls"].to_numpy())
        np.testing.assert_allclose(got["x_err"], expected["x_err"].to_numpy(), rtol=1e-12)


def test_chunked_sweep_equals_one_program(problem, swept):
    """max_batch=3 splits the 4 points into two batches of 2 (padded equal shapes)."""
    chunked = bl.sweep(problem, "f2sa", grid=GRID, max_batch=3, **RUN)
    pd.testing.assert_frame_equal(
        chunked.drop(columns="seconds"), swept.drop(columns="seconds"), rtol=1e-12
    )


@pytest.mark.parametrize(
    "n_points, max_batch, devices, expected",
    [
        (10, 3, 1, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 9, 9]]),  # one device: as before
        (6, 100, 4, [[0, 1, 2, 3, 4, 5, 5, 5]]),  # padded to a multiple of the devices
        (10, 4, 4, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 9, 9]]),
        (9, 3, 4, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 8, 8, 8]]),  # max_batch rounded up to 4
    ],
)
def test_batches_split_evenly_over_the_devices(n_points, max_batch, devices, expected):
    """Every batch has one size (one compilation) that the devices divide, at most max_batch
    rounded up to a multiple of them, and covers every point; padding repeats the last."""
    from bilevel.drivers.sweep import _batches

    assert _batches(n_points, max_batch, devices) == expected


def test_sweep_over_more_devices_than_jax_sees_names_the_flag(problem):
    """(The 4-device runs are in tests/test_parallel.py, in a child process.)"""
    with pytest.raises(ValueError, match=r"sweep\(devices=64\).*xla_force_host_platform"):
        bl.sweep(problem, "f2sa", grid=GRID, devices=64, **RUN)
    with pytest.raises(ValueError, match="devices= or mesh=, not both"):
        bl.sweep(problem, "f2sa", grid=GRID, devices=1, mesh=object(), **RUN)


@pytest.mark.parametrize(
    "field, values",
    [("batch_size", [8, 16]), ("inner_steps", [1, 2]), ("regime", ["stochastic", "constant"])],
)
def test_a_static_grid_field_is_refused_naming_it(problem, field, values):
    run = {k: v for k, v in RUN.items() if k != field}
    with pytest.raises(ValueError, match=rf"'{field}'.*static.*[Ll]oop over it"):
        bl.sweep(problem, "f2sa", grid={field: values}, **run)


def test_a_field_both_in_the_grid_and_a_keyword_is_refused(problem):
    with pytest.raises(ValueError, match="'lr_outer' is given both in grid= and as a keyword"):
        bl.sweep(problem, "f2sa", grid={"lr_outer": [0.1]}, lr_outer=0.2, steps=5)


def test_cli_sweep_writes_csv_and_heat_map(tmp_path):
    out = tmp_path / "sw"
    args = ["sweep", "--problem", "quadratic-stochastic", "--solver", "f2sa", "--steps", "40"]
    args += ["--grid", "lr_outer=0.01,0.05", "--grid", "lr_inner=0.1,0.2", "--seeds", "2"]
    args += ["--eval-every", "20", "--batch-size", "16", "--out", str(out), "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 4 * 2 * 3
    assert (out / "sweep.png").stat().st_size > 1000
    assert "grad_norm: " in result.output and "at lr_outer=" in result.output


def test_cli_sweep_static_field_is_one_error_line(tmp_path):
    args = ["sweep", "--problem", "quadratic-stochastic", "--grid", "batch_size=8,16"]
    result = CliRunner().invoke(app, args + ["--steps", "5", "--out", str(tmp_path)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "batch_size" in lines[0]


def test_ibcg_auto_gamma_gets_the_horizon_from_steps():
    """``bl.sweep`` fills ``horizon=None`` with ``steps`` as ``bl.solve`` does, so IBCG's
    ``lr_outer="auto"`` (gamma = 1/sqrt(K)) resolves; each point matches its own solve."""
    dx = 4
    quad = bl.problems.quadratic(dx=dx, dy=6)
    problem = quad.replace(x_set=bl.sets.Simplex(), x0=np.full(dx, 1.0 / dx))
    run = dict(steps=40, eval_every=20, progress=False)
    swept = bl.sweep(problem, "ibcg", grid={"lr_inner": [0.05, 0.1]}, lr_outer="auto", **run)
    assert len(swept) == 2 * 3 and swept.attrs["diverged"] == []
    for lr_inner in (0.05, 0.1):
        solver = bl.solvers.make("ibcg", lr_inner=lr_inner)
        expected = bl.solve(problem, solver, **run).history.reset_index(drop=True)
        got = swept[swept.lr_inner == lr_inner].reset_index(drop=True)
        for column in ("x_err", "fw_gap_estimate", "outer_loss"):
            np.testing.assert_allclose(got[column], expected[column], rtol=1e-12, err_msg=column)


def test_a_step_whose_key_depends_on_a_swept_value_gets_a_clear_error(problem):
    """A sweep shares each seed's key across grid points; a (user) solver that mixes a swept
    hyperparameter into its key is told so, not shown vmap's out_axes message."""
    import dataclasses

    import jax

    from bilevel.solvers.hypergradient.stocbio import StocBiO

    @dataclasses.dataclass(frozen=True)
    class KeyedByStep(StocBiO):
        def step(self, problem, state):
            state = super().step(problem, state)
            salt = (self.lr_outer * 1e6).astype("uint32")
            return state._replace(key=jax.random.fold_in(state.key, salt))

    with pytest.raises(ValueError, match="makes its PRNG key depend on the swept"):
        bl.sweep(
            problem,
            KeyedByStep(),
            grid={"lr_outer": [0.01, 0.02]},
            steps=4,
            eval_every=2,
            batch_size=8,
            progress=False,
        )
