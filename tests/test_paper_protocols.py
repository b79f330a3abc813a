"""The paper protocols of the reproductions (issue #35): their stated values, and that the methods
the experiments build get them (a typo in a step size or a dropped schedule fails here)."""

import numpy as np

import bilevel as bl
from bilevel.experiments import pzobo_deep_hyperrep as e3
from bilevel.experiments.protocols import OURS


def test_e3_paper_protocol_values_and_sources():
    p = e3.PAPER_PROTOCOL
    assert p["outer steps"] == 1000 and p["inner steps N"] == 10
    assert p["minibatch B (inner and outer)"] == 256
    assert p["PZOBO-S smoothing mu"] == 0.01 and p["PZOBO-S directions Q"] == 1
    assert p.source("minibatch B (inner and outer)") == e3.PAPER_B3
    assert p.source("PZOBO-S inner lr") == e3.AUTHORS
    assert p.source("baselines' inner lr (SGD)") == OURS


def test_e3_full_methods_follow_the_authors_code():
    """Full mode: 1000 steps, N = 10, B = 256, Adam outer at 1e-3 / 5e-4 / 1e-4 from steps 0 /
    80 / 180, and PZOBO-S's inner Adam on the same schedule of the outer step (the code's
    global ``lr``), or constant 1e-3 when asked."""
    methods, sweep, n = e3.e3_methods(quick=False)
    assert n == 10
    by_label = {m.label: m for m in methods + sweep}
    pz = by_label["PZOBO-S"]
    assert pz.steps == 1000 and pz.hyper["batch_size"] == 256 and pz.hyper["inner_steps"] == 10
    assert pz.hyper["inner_optimizer"] == "adam" and pz.hyper["smoothing"] == 0.01
    ks = np.array([0, 79, 80, 179, 180, 999])
    want = [1e-3, 1e-3, 5e-4, 5e-4, 1e-4, 1e-4]
    for m in methods + sweep:
        np.testing.assert_allclose([float(m.hyper["lr_outer"](k)) for k in ks], want, rtol=1e-6)
    for m in [pz, *sweep]:
        np.testing.assert_allclose([float(m.hyper["lr_inner"](k)) for k in ks], want, rtol=1e-6)
    constant, _, _ = e3.e3_methods(quick=False, inner_follows_outer=False)
    assert constant[0].hyper["lr_inner"] == 0.001
    pz.make()  # the solver accepts the schedules


def test_f2obo_imbalanced_paper_protocol_reaches_every_method():
    """Sec. 6.1: alpha = 0.1 and gamma = 0.001 for all, K = 5 (OBBO, F2OBO), 1 (F2OBO-SL,
    FSOBO), AOBO's delta 0.1, AF2OBO's (0.5, 0.1), lam_t = 5t; no cap on the adaptive loops
    (the full mode's 1000 is the solvers' own safety cap)."""
    from bilevel.experiments import f2obo_imbalanced as e1

    p = e1.PAPER_PROTOCOL
    assert p["lr_inner alpha (all)"] == 0.1 and p["lr_outer gamma (all)"] == 0.001
    assert p["K (OBBO, F2OBO)"] == 5 and p["runs (seeds)"] == 5
    assert e1.FULL["cap"] == 1000 == bl.solvers.make("af2obo").max_inner_steps
    assert 4 * e1.FULL["rounds_per_phase"] == 400
    methods = {label: (name, e1.with_cap(h, e1.FULL["cap"])) for label, name, h in e1.PAPER_METHODS}
    for _, hyper in methods.values():
        assert hyper["lr_inner"] == 0.1 and hyper["lr_outer"] == 0.001
    assert methods["OBBO"][1]["inner_steps"] == 5 and methods["F2OBO"][1]["inner_steps"] == 5
    assert methods["F2OBO-SL"][1]["inner_steps"] == 1
    assert methods["AOBO"][1]["tolerance"] == 0.1 and methods["AOBO"][1]["linear_steps"] == 5
    af2 = methods["AF2OBO"][1]
    assert (af2["delta_y"], af2["delta_z"], af2["lam1"], af2["tau"]) == (0.5, 0.1, 5.0, 1.0)
    assert af2["max_inner_steps"] == 1000
    for name, hyper in methods.values():
        bl.solvers.make(name, **hyper)  # every setting is a real hyperparameter


# ---- stable-hpo (STABLE, Sec. 4, eq. (32)): paper-box and paper-exp -------------------------
STABLE_GRID = [1.0, 0.5, 0.1, 0.05, 0.01]  # STABLE paper, Sec. 4
STABLE_TAUS = [None, 0.5, 0.1, 0.0224]  # ours: default (k+1)^(-1/2), two constants, 1/sqrt(2000)


def test_stable_hpo_protocols_hold_the_stated_values():
    from bilevel.experiments import stable_hpo as sh

    assert [p.name for p in sh.PROTOCOLS] == ["paper-box", "paper-exp"]
    for p in sh.PROTOCOLS:
        assert list(p["step_grid"]) == STABLE_GRID
        assert p.source("step_grid").startswith("STABLE paper, Sec. 4")
        assert p["seeds"] == 50 and p.source("seeds").startswith("STABLE paper, Sec. 4, Fig. 2")
        assert p["methods"] == ("STABLE", "TTSA", "BSA")
        assert p["regime"] == "constant" and p.source("regime").startswith("STABLE paper, Sec. 4")
        assert p["datasets"] == ("australian", "ijcnn1", "covtype")
        assert "eq. (32)" in p.source("loss")
        ours = {
            "tau_grid": tuple(STABLE_TAUS),
            "steps": 2000,
            "eval_every": 50,
            "batch": 32,
            "grid_steps": 300,
            "grid_seeds": 5,
            "max_train": 20000,
            "x0_range": (0.01, 1.0),
            "y0_std": 0.1,
            "mu_g": "auto",
            "max_cross_norm": None,
            "neumann_steps": 10,
            "bsa_inner_steps": 10,
            "hessian_inverse": "sum",
        }
        assert {k: p[k] for k in ours} == ours
        for key in (*ours, "split", "grid_rule", "objective_error", "x_box"):
            assert p.source(key).startswith(OURS), key
    box, exp = sh.PAPER_BOX, sh.PAPER_EXP
    assert box["form"] == "xy2" and box.source("form").startswith("STABLE paper, Sec. 4, eq. (32)")
    assert box["x_box"] == (1e-3, 10.0)
    assert exp["form"] == "exp" and exp.source("form").startswith(OURS)
    assert "benchopt" in exp.source("form") and exp["x_box"] is None
    differ = {k for k in box.settings if box.settings[k] != exp.settings.get(k)}
    assert differ == {"form", "x_box"} and set(exp.settings) == set(box.settings)


def test_stable_hpo_methods_get_the_protocols_values():
    from bilevel.experiments import stable_hpo as sh
    from bilevel.experiments.common import paper_solver

    for protocol in sh.PROTOCOLS:
        s = sh.settings(protocol, quick=False, seeds=50)
        sizes = (s["steps"], s["eval_every"], s["grid_steps"], s["grid_seeds"], s["seeds"])
        assert sizes == (2000, 50, 300, 5, 50)
        methods = sh.plan(s)
        assert list(methods) == ["STABLE", "TTSA", "BSA"]
        steps = {"lr_outer": STABLE_GRID, "lr_inner": STABLE_GRID}
        base = {"regime": "constant", "batch_size": 32}
        neumann = dict(base, neumann_steps=10, hessian_inverse="sum")
        assert methods["STABLE"] == (
            "stable",
            dict(base, mu_g="auto", max_cross_norm=None),
            dict(steps, tau=STABLE_TAUS),
        )
        assert methods["TTSA"] == ("ttsa", neumann, steps)
        assert methods["BSA"] == ("bsa", dict(neumann, inner_steps=10), steps)
        for solver, hyper, grid in methods.values():  # a misspelt setting is an error here
            paper_solver(solver, **hyper, **{k: v[0] for k, v in grid.items()})


def test_stable_hpo_problems_and_starts_follow_the_form():
    """paper-box projects onto [1e-3, 10]; paper-exp is unconstrained and starts at
    lambda0 = log x0 of the same x0 (and the same y0)."""
    import jax

    from bilevel.experiments import stable_hpo as sh

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = np.where(rng.normal(size=40) > 0, 1.0, -1.0)
    starts = {}
    for protocol in sh.PROTOCOLS:
        problem, init = sh.setup(X, y, sh.settings(protocol, quick=False))
        assert f"form={protocol['form']}" in problem.name and problem.n_inner == 20
        starts[protocol.name] = init(jax.random.PRNGKey(3))
        if protocol["x_box"] is None:
            assert problem.x_set is None
        else:
            assert (float(problem.x_set.lower), float(problem.x_set.upper)) == (1e-3, 10.0)
    (x_box, y_box), (lam, y_exp) = starts["paper-box"], starts["paper-exp"]
    assert np.all((0.01 <= x_box) & (x_box <= 1.0))
    np.testing.assert_allclose(np.exp(lam), x_box, rtol=1e-5)
    np.testing.assert_array_equal(y_exp, y_box)


def test_stable_hpo_quick_run_states_what_it_changed():
    from bilevel.experiments import stable_hpo as sh

    s = sh.settings(sh.PAPER_EXP, quick=True, seeds=50)
    assert s["steps"] == sh.QUICK["steps"] and s["seeds"] == sh.QUICK["seeds"]
    assert s["tau_grid"] == (None,) and s["datasets"] == ("australian",)
    assert s["grid"] == {k: list(v) for k, v in sh.QUICK["grid"].items()}
    shown = sh.as_run(sh.PAPER_EXP, s, quick=True)
    assert shown["steps"] == sh.QUICK["steps"]
    assert shown.source("steps") == "QUICK run (protocol: 2000)"
    assert shown.source("form") == sh.PAPER_EXP.source("form")
    full = sh.settings(sh.PAPER_EXP, quick=False, seeds=50)
    assert sh.as_run(sh.PAPER_EXP, full, quick=False) is sh.PAPER_EXP
