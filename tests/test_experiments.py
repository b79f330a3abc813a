"""Every experiment's --quick mode runs, writes its files, and holds finite numbers.

These are smoke tests of the reproduction pipeline (the full runs and their verdicts are in
docs/reproduction.md); they also check that quick outputs are labelled as such.
"""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from bilevel import experiments
from bilevel.cli import app

NAMES = experiments.names()


def test_list_names_every_experiment():
    out = CliRunner().invoke(app, ["reproduce", "--list"])
    assert out.exit_code == 0
    for name in (
        "stable-hpo",
        "pzobo-hyperrep-linear",
        "pzobo-hyperrep-2layer",
        "pzobo-deep-hyperrep",
        "pzobo-l2-hpo",
        "f2sa-hypercleaning",
    ):
        assert name in out.output and name in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_quick_mode_writes_finite_outputs(name, tmp_path, monkeypatch):
    # no user data: every experiment must fall back to its stand-in and say so
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path / "empty"))
    # each experiment's own seed count, capped at 2 (stable-hpo and f2sa-hypercleaning run 2
    # seeds: mean +- std bands; the one-seed PZOBO experiments compile half as much, which
    # keeps the six quick modes under CI's 5-minute budget)
    seeds = min(2, experiments.get(name).default_seeds)
    out = CliRunner().invoke(
        app, ["reproduce", name, "--quick", "--out", str(tmp_path), "--seeds", str(seeds)]
    )
    assert out.exit_code == 0, out.output + repr(out.exception)
    root = tmp_path / name
    claims = (root / "claims.md").read_text()
    if name == "stable-hpo":  # a missing real dataset: how to get it, and the stand-in used
        assert "australian not found" in out.output and "BILEVEL_DATA" in out.output
        assert "SUBSTITUTE for australian: scikit-learn breast_cancer" in claims
    assert "QUICK RUN" in claims and "| claim | paper | measured | verdict |" in claims
    assert list(root.glob("*.png")), "no figure written"
    if name == "pzobo-hyperrep-2layer":  # panel (e) and the N-sweep (f) beside the main one
        assert (root / "hypergrad_norm.png").exists() and (root / "n_sweep.png").exists()
    curves = list((root / "curves").glob("*.csv"))
    assert curves
    for path in curves:
        frame = pd.read_csv(path)
        numeric = frame.select_dtypes("number")
        assert len(frame) >= 2 and np.isfinite(numeric.to_numpy()).all(), path.name
    summary = json.loads((root / "summary.json").read_text())
    assert summary["quick"] is True


def test_unknown_experiment_is_a_clear_error(tmp_path):
    out = CliRunner().invoke(app, ["reproduce", "stable-hp0", "--out", str(tmp_path)])
    assert out.exit_code == 2 and "unknown experiment 'stable-hp0'" in out.output


def test_wrong_dataset_file_says_which_file_and_what(tmp_path, monkeypatch):
    libsvm = tmp_path / "data" / "libsvm"
    libsvm.mkdir(parents=True)
    (libsvm / "australian_scale").write_text("+1 1:0.5 2:0.25\n-1 1:0.1 3:\n")
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path / "data"))
    out = CliRunner().invoke(
        app, ["reproduce", "stable-hpo", "--quick", "--out", str(tmp_path / "out"), "--seeds", "1"]
    )
    assert out.exit_code == 2
    assert "australian_scale" in out.output and "line 2" in out.output


def test_grid_search_scores_every_start_and_rules_out_divergence():
    import math

    import jax

    import bilevel as bl
    from bilevel.experiments.common import grid_search

    problem = bl.problems.quadratic()
    base = {"lr_inner": 0.05}
    grid = {"lr_outer": [1e4, 0.05, 0.01]}  # 1e4 diverges

    def far_start(key):  # random starts far from x0: the scores must move with them
        return 10.0 + jax.random.normal(key, problem.x0.shape), problem.y0

    kw = dict(steps=40, metric="F_gap", seeds=3)
    best, table = grid_search(problem, "stocbio", base, grid, **kw)
    _, table_far = grid_search(problem, "stocbio", base, grid, init=far_start, **kw)
    assert best == {"lr_inner": 0.05, "lr_outer": 0.05}
    assert math.isinf(table.F_gap[0]) and math.isinf(table_far.F_gap[0])
    assert np.all(np.isfinite(table.F_gap[1:])) and table.F_gap[1] < table.F_gap[2]
    assert np.all(table_far.F_gap[1:] > table.F_gap[1:])  # started far away: higher F_gap


def test_unrolled_grad_norm_is_the_gradient_of_the_unrolled_loss():
    """E2 panel (e)'s metric: ||d/dx f(x, w^N(x))|| against central differences of the
    outer_loss_N metric itself (float64, step 1e-6: truncation error ~1e-12 relative)."""
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    from bilevel.experiments.pzobo_experiments import with_unrolled_loss
    from bilevel.problems import hyper_representation, synthetic_hyperrep_data

    data = synthetic_hyperrep_data("2layer", m=3, d=2, n=20, hidden=2, seed=1)
    base = hyper_representation(*data, kind="2layer", d=2, hidden=2, gamma=0.5, seed=1)
    problem = with_unrolled_loss(base, 4, 0.1, grad_norm=True)
    flat, unravel = ravel_pytree(problem.x0)
    metrics = jax.jit(lambda fx: problem.metrics(unravel(fx), problem.y0))
    h = 1e-6
    fd = np.array(
        [
            (metrics(flat + h * e)["outer_loss_N"] - metrics(flat - h * e)["outer_loss_N"])
            / (2 * h)
            for e in np.eye(flat.size)
        ]
    )
    m0 = metrics(flat)
    assert (
        abs(
            m0["outer_loss_N"]
            - with_unrolled_loss(base, 4, 0.1).metrics(problem.x0, problem.y0)["outer_loss_N"]
        )
        < 1e-12
    )
    np.testing.assert_allclose(m0["grad_norm_N"], np.linalg.norm(fd), rtol=1e-6)
    assert float(jnp.linalg.norm(fd)) > 1e-3  # not a trivially zero gradient


def test_e2_starts_away_from_the_data_generating_model():
    """The data and the default starts both draw from numpy seeds: with the same seed E2 began
    at (H1*, H2*, w*) themselves, outer loss at the noise level 0.1^2 / 2 (a bug once). The
    start must be an independent draw: loss far above the noise (~4.97 at the quick size)."""
    from bilevel.experiments.pzobo_experiments import e2_problem

    problem, _, _ = e2_problem(quick=True)
    assert problem.metrics(problem.x0, problem.y0)["outer_loss_N"] > 1.0


def test_e3_claims_name_a_run_that_diverged(tmp_path):
    """A diverged run keeps its history to its last finite evaluation; the accuracy claim must
    say it stopped rather than present its start as a final accuracy."""
    import time

    from bilevel.experiments.common import Method
    from bilevel.experiments.pzobo_experiments import _E3Outputs

    methods = [Method(label, "pzobo-s", {}, 4, 2) for label in ("PZOBO-S", "AID-CG")]

    def hist(label, steps, acc):
        return pd.DataFrame(
            {
                "method": label,
                "seed": 0,
                "step": steps,
                "samples": [10 * s for s in steps],
                "seconds": [0.1 * s for s in steps],
                "eval_acc": acc,
                "eval_loss": [1.0] * len(steps),
            }
        )

    hists = {
        "PZOBO-S": hist("PZOBO-S", [0, 2, 4], [0.1, 0.5, 0.8]),
        "AID-CG": hist("AID-CG", [0], [0.1]),
    }
    run = _E3Outputs(tmp_path, methods, [], 3, "note", True, {}, time.perf_counter())
    run.write(hists, done=2)
    claims = (tmp_path / "claims.md").read_text()
    assert "AID-CG 0.100 (diverged after step 0)" in claims and "PZOBO-S 0.800," in claims
