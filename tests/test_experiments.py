"""Every experiment's --quick mode runs, writes its files, and holds finite numbers.

These are smoke tests of the reproduction pipeline (the full runs and their verdicts are in
docs/reproduction.md); they also check that quick outputs are labelled as such.
"""

import contextlib
import json

import jax
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import bilevel as bl
from bilevel import experiments
from bilevel.cli import app

NAMES = experiments.names()


#: what each quick mode's claims.md must say on a machine without MNIST, Fashion-MNIST and 20
#: Newsgroups: the stand-in it used and the sizes it cut to fit it (E1 and E2 use synthetic data;
#: stable-hpo's quick mode runs its australian panel only)
STAND_INS = {
    "ibcg-toy": (),
    "pzobo-hyperrep-linear": (),
    "pzobo-hyperrep-2layer": (),
    "stable-hpo": ("SUBSTITUTE for australian: scikit-learn breast_cancer",),
    "pzobo-deep-hyperrep": ("SUBSTITUTE: scikit-learn digits",),
    "f2sa-hypercleaning": (
        "SUBSTITUTE: scikit-learn digits",
        "Sizes cut to fit the data (1257 training and 540 test images): n_train 2000 -> 1057",
    ),
    "ibcg-matrix-completion": (),
    "pzobo-l2-hpo": (
        "SUBSTITUTE: scikit-learn digits (1257 training images, 64 pixel features",
        "Splits cut to fit: 419 train / 419 validation / 419 test",
    ),
    "f2obo-oscillating": (),
    "f2obo-imbalanced": ("SUBSTITUTE: scikit-learn digits",),
    "pzobo-meta": ("SUBSTITUTE: scikit-learn digits (1797 8x8 images upsampled to 32x32",),
    "f2obo-online-hpo": (
        "SUBSTITUTE: scikit-learn digits (64 pixel features",
        "training pool 1078, validation pool 360, test 359) stands in for 20 Newsgroups",
    ),
}


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
        "ibcg-matrix-completion",
        "ibcg-toy",
    ):
        assert name in out.output and name in NAMES


def test_every_experiment_has_its_stand_in_listed():
    assert sorted(STAND_INS) == sorted(NAMES)


#: quick modes whose time is running, not compiling, where the module's flag costs more than
#: it saves: pzobo-meta trains each learner for a fixed second and evaluates MAML's and
#: first-order MAML's meta-test adaptation (5 CNN4 steps per task) twice; with most XLA
#: optimisations off it took 186 s wall / 329 CPU-s alone, fully optimised 81 s / 132 CPU-s
#: (measured 2026-11-27; the other quick modes gain 10-40% from the flag)
EXECUTION_BOUND = {"pzobo-meta"}


@contextlib.contextmanager
def _optimised(on: bool):
    """Full XLA optimisation inside the block when ``on``. The module compiles with most
    optimisations off (``tests/conftest.py``): a quick mode's time is compiling one step and one
    evaluation program per method, and what these tests check (the files, the labels, finite
    numbers) does not depend on how well the code is optimised (pzobo-hyperrep-2layer's quick
    mode: 31 -> 20 CPU-s, measured 2026-11-27)."""
    previous = jax.config.read("jax_disable_most_optimizations")
    if on:
        jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


@pytest.mark.parametrize("name", NAMES)
def test_quick_mode_writes_finite_outputs(name, tmp_path, monkeypatch):
    # no user data and, whatever this machine has installed (Fashion-MNIST, scikit-learn's
    # 20 Newsgroups cache), none of it: every experiment must fall back to its smallest
    # stand-in, fit its sizes to it, and say which one it used
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")
    # each experiment's own seed count, capped at 2 (stable-hpo and f2sa-hypercleaning run 2
    # seeds: mean +- std bands; the one-seed PZOBO experiments compile half as much, which
    # keeps the six quick modes under CI's 5-minute budget)
    seeds = min(2, experiments.get(name).default_seeds)
    with _optimised(name in EXECUTION_BOUND):
        out = CliRunner().invoke(
            app, ["reproduce", name, "--quick", "--out", str(tmp_path), "--seeds", str(seeds)]
        )
    assert out.exit_code == 0, out.output + repr(out.exception)
    root = tmp_path / name
    claims = (root / "claims.md").read_text()
    if name == "stable-hpo":  # a missing real dataset: how to get it, and the stand-in used
        assert "australian not found" in out.output and "BILEVEL_DATA" in out.output
    for text in STAND_INS[name]:
        assert text in claims
    if not STAND_INS[name]:
        assert "SUBSTITUTE" not in claims
    assert "SUBSTITUTE: Fashion-MNIST" not in claims and "SUBSTITUTE: MNIST" not in claims
    assert "QUICK RUN" in claims and "| protocol | claim | paper | measured | verdict |" in claims
    assert list(root.glob("*.png")), "no figure written"
    if name == "pzobo-hyperrep-2layer":  # panel (e) and the N-sweep (f) beside the main one
        assert (root / "hypergrad_norm.png").exists() and (root / "n_sweep.png").exists()
    if name == "ibcg-toy":  # the paper-layout figures (theta_k paths), listed in claims.md
        for fig in ("fig1", "fig3", "fig4"):
            assert (root / f"{fig}.png").exists() and f"{fig}.png" in claims
    curves = list((root / "curves").glob("*.csv"))
    assert curves
    for path in curves:
        frame = pd.read_csv(path)
        numeric = frame.select_dtypes("number")
        assert len(frame) >= 2 and np.isfinite(numeric.to_numpy()).all(), path.name
    summary = json.loads((root / "summary.json").read_text())
    assert summary["quick"] is True
    if name == "f2obo-imbalanced":  # a rerun loads every finished method instead of playing it
        again = CliRunner().invoke(
            app, ["reproduce", name, "--quick", "--out", str(tmp_path), "--seeds", str(seeds)]
        )
        assert again.exit_code == 0, again.output + repr(again.exception)
        assert again.output.count("loaded from") == 3  # the quick mode's three methods
        rerun = (root / "claims.md").read_text()
        assert "Resumed: these methods were loaded from methods/" in rerun
        assert _claims_table(rerun) == _claims_table(claims)


def _claims_table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


@pytest.mark.parametrize(
    ("where", "ignore", "expected"),
    [
        ("system", "0", "Fashion-MNIST"),  # installed: used
        ("system", "1", "scikit-learn digits"),  # installed but ignored
        ("BILEVEL_DATA", "1", "Fashion-MNIST"),  # the user's own copy: always used
    ],
)
def test_image_experiments_take_fashion_mnist_when_present(
    where, ignore, expected, tmp_path, monkeypatch
):
    """The quick-mode test hides installed data; this cheap one checks the other situation:
    with Fashion-MNIST's files present (small fakes) the image experiments load and name it,
    unless BILEVEL_IGNORE_SYSTEM_DATA hides a system-wide copy."""
    from test_data_idx import make_split

    from bilevel.data import idx as idx_module
    from bilevel.data.standins import mnist_or_substitute
    from bilevel.experiments.pzobo_l2_hpo import e5_data
    from bilevel.experiments.stable_hpo import load_panel

    fashion = tmp_path / "fashion-mnist"
    fashion.mkdir()
    make_split(fashion, "train", 60, seed=0, gz=True)
    make_split(fashion, "t10k", 20, seed=1, gz=True)
    system = fashion if where == "system" else tmp_path / "no-system-copy"
    monkeypatch.setattr(idx_module, "FASHION_MNIST_SYSTEM_DIR", system)
    # $BILEVEL_DATA/fashion-mnist is the fake set in the BILEVEL_DATA case, absent otherwise
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path if where == "BILEVEL_DATA" else system))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", ignore)
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path / "no-20-newsgroups"))

    def quiet(message: str) -> None:  # the loaders' "not found, using ..." messages
        pass

    loaded = mnist_or_substitute(quiet)
    assert loaded.name == expected and loaded.note.startswith(f"SUBSTITUTE: {expected}")
    assert len(loaded.train_labels) == (60 if expected == "Fashion-MNIST" else 1257)
    _, _, _, note = e5_data(True, quiet)
    features = 784 if expected == "Fashion-MNIST" else 64
    assert note.startswith(f"SUBSTITUTE: {expected} (") and f"{features} pixel features" in note
    covtype = load_panel("covtype", quiet)[2]
    if expected == "Fashion-MNIST":
        assert "Fashion-MNIST 7x7 (49 features), classes {0,2,4,6} vs rest (60 samples)" in covtype
    else:
        assert "scikit-learn digits, even vs odd" in covtype and "IGNORE_SYSTEM_DATA" in covtype


def test_full_mode_sizes_fit_the_digits_stand_in(monkeypatch, tmp_path):
    """Full modes on the smallest stand-in (1257 + 540 digits) must not ask for more samples
    than there are, nor batches larger than a split; on Fashion-MNIST's 60000 + 10000 images
    the paper's sizes stay as they are."""
    from bilevel.experiments import f2sa_hypercleaning as hc
    from bilevel.experiments.pzobo_deep_hyperrep import e3_problem
    from bilevel.experiments.pzobo_l2_hpo import e5_problem

    assert hc.fit_sizes(hc.FULL, 60000, 10000) == (hc.FULL, None)
    cfg, note = hc.fit_sizes(hc.FULL, 1257, 540)
    assert (cfg["n_train"], cfg["n_val"], cfg["n_test"]) == (838, 419, 540)
    assert cfg["batches"] == (50, 419) and "batches (50, 500) -> (50, 419)" in note
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")
    problem, note, n = e5_problem(False, lambda message: None)
    assert n == 419 and problem.n_inner == 419 and "requested 10000 each" in note
    _, _, n_in, n_out = e3_problem(False, lambda message: None)
    assert (n_in, n_out) == (540, 1257)


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
    from bilevel.experiments.pzobo_deep_hyperrep import _E3Outputs

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


def test_grid_search_as_one_sweep_scores_as_the_loop_of_solves():
    """A float grid runs as one bl.sweep program: the same scores (to vmap's reordering of
    float64 sums, 1e-12) and the same pick as one bl.solve per point; a diverging point is out."""
    from bilevel.experiments.common import _scores_looped, grid_search

    problem = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=64)
    base = {"batch_size": 16, "inner_steps": 2}
    grid = {"lr_outer": [0.01, 0.05, 50.0], "lr_inner": [0.05, 0.1]}  # 50.0 diverges
    best, table = grid_search(problem, "f2sa", base, grid, steps=60, metric="grad_norm", seeds=2)
    points = [(a, b) for a in grid["lr_outer"] for b in grid["lr_inner"]]
    looped = _scores_looped(
        problem, "f2sa", base, list(grid), points, 60, "grad_norm", None, 2, None
    )
    np.testing.assert_allclose(table["grad_norm"].to_numpy(), looped, rtol=1e-12)
    assert np.isinf(looped[-1]) and np.isinf(table["grad_norm"].iloc[-1])
    assert (best["lr_outer"], best["lr_inner"]) == points[int(np.argmin(looped))]
