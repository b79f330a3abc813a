"""The paper protocols of the reproductions (issue #35): their stated values, and that the methods
the experiments build get them (a typo in a step size or a dropped schedule fails here)."""

import numpy as np

import bilevel as bl
from bilevel.experiments import pzobo_deep_hyperrep as e3
from bilevel.experiments.protocols import OURS
from bilevel.solvers.frank_wolfe.sbfw import PAPER as SBFW_PAPER


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


# ---- the other paper protocols (issue #35): stated values, sources, and the run's config -----
def _sourced(protocol, *, cited: dict[str, str]):
    """Every setting is Sourced with a non-empty source; ``cited``: key -> the start of its
    source (the paper's section or the authors' file)."""
    from bilevel.experiments.protocols import PAPER, Sourced

    assert protocol.name == PAPER
    for key, setting in protocol.settings.items():
        assert isinstance(setting, Sourced) and setting.source.strip(), key
    for key, start in cited.items():
        assert protocol.source(key).startswith(start), (key, protocol.source(key))


def _hypers(methods) -> dict:
    """``label -> (solver, hyperparameters)`` of experiment Methods; each builds a solver."""
    from bilevel.experiments.common import paper_solver

    for m in methods:
        paper_solver(m.solver, **m.hyper)  # a misspelt or unknown setting fails here
    return {m.label: (m.solver, m.hyper) for m in methods}


def test_e1_paper_protocol_values_and_methods():
    """PZOBO E1 (App. B.2 and the authors' HyperRepresentation.ipynb): N = 20, alpha = 0.001,
    Adam 0.05 (HOZOG 0.1, AID-CG 0.01 at d = 256), mu = 0.01, gamma = 0.1, K = N."""
    from bilevel.experiments import pzobo_experiments as pe

    p = pe.E1_PAPER_PROTOCOL
    b2 = "PZOBO paper, App. B.2"
    nb = "authors' code, HyperRepresentation.ipynb"
    _sourced(
        p,
        cited={
            "d": "PZOBO paper, Fig. 2",
            "gamma (ridge)": b2,
            "N (inner GD steps)": b2,
            "alpha (inner GD step)": b2,
            "outer lr": b2,
            "mu (PZOBO, HOZOG)": b2,
            "HOZOG outer lr": nb,
            "AID-CG outer lr at d = 256": nb,
            "outer steps": nb,
            "eval every": OURS,
        },
    )
    assert p["d"] == (128, 256) and p["m (input dimension)"] == (64, 128)
    assert p["n (inner and outer samples)"] == (500, 1000) and p["outer steps"] == (100, 150)
    assert (p["gamma (ridge)"], p["N (inner GD steps)"], p["alpha (inner GD step)"]) == (
        0.1,
        20,
        0.001,
    )
    assert (p["outer lr"], p["HOZOG outer lr"], p["AID-CG outer lr at d = 256"]) == (
        0.05,
        0.1,
        0.01,
    )
    assert p["mu (PZOBO, HOZOG)"] == 0.01 and p["Q (directions per step)"] == 1
    assert p["N-sweep (Fig. 2 (c), d = 128)"] == (10, 20, 40) and p["seeds"] == 1
    cases = pe.e1_cases(pe.e1_settings(quick=False))
    assert cases == {
        128: dict(m=64, d=128, n=500, steps=100),
        256: dict(m=128, d=256, n=1000, steps=150),
    }
    for d, lr_cg in ((128, 0.05), (256, 0.01)):
        methods = _hypers(pe.e1_methods(d, cases[d]["steps"]))
        assert list(methods) == ["PZOBO", "AID-FP", "AID-CG", "ITD-R", "HOZOG"]
        for _, hyper in methods.values():
            assert hyper["inner_steps"] == 20 and hyper["lr_inner"] == 0.001
            assert hyper["outer_optimizer"] == "adam" and hyper["warm_start"] is False
        lrs = {label: h["lr_outer"] for label, (_, h) in methods.items()}
        assert lrs == {"PZOBO": 0.05, "AID-FP": 0.05, "AID-CG": lr_cg, "ITD-R": 0.05, "HOZOG": 0.1}
        for label in ("AID-FP", "AID-CG"):  # hypertorch's AID: the adjoint from v = 0
            assert methods[label][1]["linsolve_steps"] == 20
            assert methods[label][1]["warm_adjoint"] is False
        for label in ("PZOBO", "HOZOG"):
            hyper = methods[label][1]
            assert hyper["smoothing"] == 0.01 and hyper["num_directions"] == 1
            assert hyper["directions"] == "sphere_unscaled_per_tensor"


def test_e1_quick_run_states_what_it_changed():
    from bilevel.experiments import pzobo_experiments as pe
    from bilevel.experiments.stable_hpo import as_run

    s = pe.e1_settings(quick=True, seeds=1)
    assert pe.e1_cases(s) == {128: dict(m=64, d=128, n=500, steps=20)}
    shown = as_run(pe.E1_PAPER_PROTOCOL, s, quick=True)
    assert shown.source("outer steps") == "QUICK run (protocol: (100, 150))"
    assert shown.source("gamma (ridge)") == "PZOBO paper, App. B.2"
    assert as_run(pe.E1_PAPER_PROTOCOL, pe.e1_settings(False, 1), False) is pe.E1_PAPER_PROTOCOL


def test_e2_paper_protocol_values_and_methods():
    """PZOBO E2 (App. B.2 and DeepHyperRepresentation.ipynb): N = 10, alpha = 0.001, Adam 0.01
    (HOZOG 0.2), mu = 0.1, ridge 0.001, AID-CG N = K = 30, the sweep at alpha = 0.0003."""
    from bilevel.experiments import pzobo_experiments as pe

    p = pe.E2_PAPER_PROTOCOL
    b2 = "PZOBO paper, App. B.2"
    nb = "authors' code, DeepHyperRepresentation.ipynb"
    _sourced(
        p,
        cited={
            "gamma (ridge)": b2,
            "N (inner GD steps)": b2,
            "alpha (inner GD step)": b2,
            "outer lr": b2,
            "mu (PZOBO, HOZOG)": b2,
            "HOZOG outer lr": nb,
            "AID-CG N = K": nb,
            "N-sweep alpha": nb,
            "n (inner and outer samples)": nb,
        },
    )
    sizes = ("m (input dimension)", "hidden", "d", "n (inner and outer samples)", "outer steps")
    assert tuple(p[k] for k in sizes) == (256, 512, 256, 5000, 100)
    assert (p["gamma (ridge)"], p["N (inner GD steps)"], p["alpha (inner GD step)"]) == (
        0.001,
        10,
        0.001,
    )
    assert (p["outer lr"], p["HOZOG outer lr"], p["mu (PZOBO, HOZOG)"]) == (0.01, 0.2, 0.1)
    assert p["AID-FP linear-system steps K"] == 10 and p["AID-CG N = K"] == 30
    assert p["N-sweep (Fig. 2 (f))"] == (5, 10, 20, 50) and p["N-sweep alpha"] == 0.0003
    methods = _hypers(pe.e2_methods(p["outer steps"]))
    lrs = {label: h["lr_outer"] for label, (_, h) in methods.items()}
    assert lrs == {"PZOBO": 0.01, "AID-FP": 0.01, "AID-CG": 0.01, "ITD-R": 0.01, "HOZOG": 0.2}
    steps = {label: h["inner_steps"] for label, (_, h) in methods.items()}
    assert steps == {"PZOBO": 10, "AID-FP": 10, "AID-CG": 30, "ITD-R": 10, "HOZOG": 10}
    assert methods["AID-CG"][1]["linsolve_steps"] == 30
    assert methods["AID-FP"][1]["linsolve_steps"] == 10
    assert methods["AID-FP"][1]["warm_adjoint"] is methods["AID-CG"][1]["warm_adjoint"] is False
    for label in ("PZOBO", "HOZOG"):
        assert methods[label][1]["smoothing"] == 0.1
    assert pe.E2_COMMON == dict(
        lr_inner=0.001, inner_steps=10, outer_optimizer="adam", warm_start=False
    )
    quick = pe.e2_settings(quick=True)
    assert tuple(quick[k] for k in sizes) == (32, 64, 32, 500, 20)
    assert quick["N-sweep (Fig. 2 (f))"] == (5,) and quick["gamma (ridge)"] == 0.001


def test_e5_paper_protocol_values_and_methods():
    """PZOBO E5 (Sec. 4.4, App. C, hypertorch's setup): N = 10 (Fig. 5 right), mu = 0.01,
    PZOBO's inner heavy ball, K = 10; the outer-step grid (with App. C's 0.02) is ours."""
    from bilevel.experiments import pzobo_l2_hpo as e5
    from bilevel.experiments.common import paper_solver

    p = e5.PAPER_PROTOCOL
    _sourced(
        p,
        cited={
            "N (inner steps)": "PZOBO paper, Sec. 4.4, Fig. 5",
            "mu (PZOBO, HOZOG)": "PZOBO paper, App. C",
            "PZOBO inner optimizer": "PZOBO paper, App. C",
            "AID-FP, AID-CG linear-system steps K": "hypertorch",
            "outer lr grid (every method)": OURS,
            "inner lr (every method)": OURS,
            "HOZOG inner optimizer": OURS,
            "outer steps": OURS,
        },
    )
    assert p["N (inner steps)"] == 10 and p["mu (PZOBO, HOZOG)"] == 0.01
    assert p["outer lr grid (every method)"] == (0.005, 0.02, 0.1, 0.5)
    assert 0.02 in p["outer lr grid (every method)"]  # App. C's outer lr for PZOBO and HOZOG
    assert (p["outer steps"], p["grid run length"], p["eval every"]) == (300, 60, 10)
    assert p["samples per split (train, validation, test)"] == 10000
    assert p["words (features)"] == 10000
    s = e5.e5_settings(quick=False)
    bases = {solver: e5.e5_base(s, solver) for _, solver in e5.METHODS}
    for solver, base in bases.items():
        assert base["inner_steps"] == 10 and base["warm_start"] is True
        assert base["outer_optimizer"] == "adam" and base["lr_inner"] == "auto"
        paper_solver(solver, **base, lr_outer=0.02)  # every setting is a real hyperparameter
    assert bases["pzobo"]["inner_optimizer"] == "momentum"
    assert bases["hozog"]["inner_optimizer"] == "gd"
    assert bases["pzobo"]["smoothing"] == bases["hozog"]["smoothing"] == 0.01
    assert bases["aid-fp"]["linsolve_steps"] == bases["aid-cg"]["linsolve_steps"] == 10
    quick = e5.e5_settings(quick=True)
    assert (quick["N (inner steps)"], quick["outer steps"], quick["grid run length"]) == (5, 20, 10)
    shown = e5.run_protocol(e5.e5_settings(False, 1), 419, quick=False)
    key = "samples per split (train, validation, test)"
    assert shown[key] == 419 and shown.source(key).startswith("cut to fit the data (10000 asked")


def test_f2sa_hypercleaning_paper_protocol_values_and_methods():
    """F2SA Sec. 5: n = 19000, m = 1000, c = 0.01, p in {0.1, 0.3}, batches 50 and 500,
    stocBiO's Neumann degree 5 (footnote 2), F2SA's shared x-sample (App. C); the run's
    configuration is the protocol's values."""
    from bilevel import experiments
    from bilevel.experiments import f2sa_hypercleaning as hc

    p = hc.PAPER_PROTOCOL
    _sourced(
        p,
        cited={
            "n_train": "F2SA paper, Sec. 5",
            "n_val": "F2SA paper, Sec. 5",
            "c": "F2SA paper, Sec. 5",
            "batches": "F2SA paper, Sec. 5",
            "corruption": "F2SA paper, Sec. 5, Fig. 2",
            "stocBiO Neumann degree": "F2SA paper, Sec. 5, footnote 2",
            "F2SA shared x-sample": "F2SA paper, App. C",
            "F2SA shared inner sample": "F2SA paper, Algorithm 1",
            "F2SA regime": "F2SA paper, Cor. 4.2",
            "grid": OURS,
            "steps": OURS,
            "inner_steps": OURS,
            "seeds": OURS,
        },
    )
    assert (p["n_train"], p["n_val"], p["c"]) == (19000, 1000, 0.01)
    assert p["corruption"] == (0.1, 0.3) and p["batches"] == (50, 500)
    assert p["stocBiO Neumann degree"] == 5 and p["F2SA shared x-sample"] is True
    assert p["grid"] == {"lr_outer": (10.0, 100.0, 1000.0), "lr_inner": (0.02, 0.1)}
    assert (p["steps"], p["inner_steps"], p["grid_steps"], p["seeds"]) == (1000, 5, 200, 2)
    assert hc.FULL == p.values() and hc.settings(quick=False) == p.values()
    assert experiments.get("f2sa-hypercleaning").default_seeds == 2
    options = hc.method_options(hc.FULL)
    assert options["stocbio"] == {"neumann_steps": 5}
    assert options["f2sa"]["shared_x_sample"] is True
    assert options["f2sa"]["shared_inner_sample"] is False  # Algorithm 1's draws
    assert options["f2sa"]["regime"] == "stochastic"
    from bilevel.experiments.common import paper_solver

    for solver, extra in options.items():  # every setting is a real hyperparameter
        paper_solver(solver, inner_steps=5, batch_size=50, lr_outer=100.0, lr_inner=0.02, **extra)
    quick = hc.settings(quick=True, seeds=1)
    assert quick["corruption"] == (0.3,) and quick["c"] == 0.01 and quick["seeds"] == 1
    cfg, note = hc.fit_sizes(hc.FULL, 1257, 540)
    shown = hc.run_protocol(hc.FULL, cfg, quick=False)
    assert shown["n_train"] == 838 and shown.source("n_train").startswith("cut to fit the data")
    assert shown["batches"] == (50, 419) and shown.source("batches").startswith("cut to fit")
    assert shown.settings["c"] == p.settings["c"] and cfg["n_val"] == shown["n_val"] == 419
    assert hc.run_protocol(hc.FULL, hc.FULL, quick=False) is p


def test_ibcg_toy_paper_protocol_values_and_figures():
    """IBCG Sec. 5.1 / App. G.2: mu_g = 1 / 0.1 / 0.1 and K = 100 / 1000 / 1000 for Figs. 1, 3,
    4; IBCG's convex rule gamma = log K / K; SBFW with the exact inverse and tuned (G.2)."""
    import bilevel as bl
    from bilevel.experiments import ibcg_toy as it

    p = it.PAPER_PROTOCOL
    _sourced(
        p,
        cited={
            "mu_g (Figs. 1, 3, 4)": "IBCG paper, Sec. 5.1",
            "K (Figs. 1, 3, 4)": "IBCG paper, Sec. 5.1",
            "x_0, theta_0, lambda_0": "IBCG paper, Sec. 5.1",
            "IBCG gamma": "IBCG paper, Cor. 4.2",
            "SBFW steps": "IBCG paper, App. G.1",
            "SBFW tuned (Fig. 4)": "IBCG paper, App. G.2",
            "SBFW with Hessian inverse (Figs. 3, 4)": "IBCG paper, App. G.2",
            "L_g": OURS,
            "A, points x_1..x_4": OURS,
            "seeds": OURS,
        },
    )
    assert p["mu_g (Figs. 1, 3, 4)"] == (1.0, 0.1, 0.1)
    assert p["K (Figs. 1, 3, 4)"] == (100, 1000, 1000) and p["L_g"] == 4.0
    assert p["IBCG gamma"] == "convex" and p["seeds"] == 3
    assert it.STEPS["full"] == {"fig1": 100, "fig3": 1000, "fig4": 1000}
    assert it.FIGURES == it.figures_of(it.settings(quick=False))
    assert [it.FIGURES[f][0] for f in ("fig1", "fig3", "fig4")] == [1.0, 0.1, 0.1]
    hypers = {(f, label): (s, h) for f, (_, ms) in it.FIGURES.items() for label, s, h in ms}
    assert hypers[("fig1", "IBCG")] == ("ibcg", {"gamma_rule": "convex", "w0": "y0"})
    # App. G.1's settings (the library's defaults differ), with G.2's variants on top
    assert hypers[("fig1", "SBFW")] == ("sbfw", SBFW_PAPER)
    assert hypers[("fig3", "SBFW (Hessian inverse)")] == (
        "sbfw",
        dict(SBFW_PAPER, hessian_inverse="exact"),
    )
    assert hypers[("fig4", "SBFW tuned (Hessian inverse)")] == (
        "sbfw",
        dict(SBFW_PAPER, variant="tuned", hessian_inverse="exact"),
    )
    for solver, hyper in hypers.values():
        bl.solvers.make(solver, **hyper)  # every setting is a real hyperparameter
    toy = it.tracked(0.1)
    eig = np.linalg.eigvalsh(toy.reference.A.T @ toy.reference.A)
    np.testing.assert_allclose(eig, [0.1, 4.0], rtol=1e-6)
    quick = it.settings(quick=True)
    assert it.steps_of(quick) == it.STEPS["quick"] == {"fig1": 30, "fig3": 60, "fig4": 60}


def test_f2obo_oscillating_paper_protocol_values_and_methods():
    """F2OBO Sec. 4.2 / Thm. 4.1: AF2OBO at tau = 1/2 with the theory thresholds; lam_1 = 5
    (App. A), the shared steps gamma = alpha = 0.1 (ours), K = 5 for the fixed-K methods."""
    import bilevel as bl
    from bilevel.experiments import f2obo_oscillating as fo

    p = fo.PAPER_PROTOCOL
    _sourced(
        p,
        cited={
            "stream": "F2OBO paper, Sec. 4.2",
            "tau (AF2OBO)": "F2OBO paper, Sec. 4.2",
            "delta_y, delta_z (AF2OBO)": "F2OBO paper, Thm. 4.1",
            "lam_1 (penalty methods)": "F2OBO paper, Thm. 4.1",
            "gamma (x step, every method)": OURS,
            "alpha (z / inner step, every method)": OURS,
            "K (F2OBO, OBBO)": OURS,
            "horizons T": OURS,
            "c, mu_g": OURS,
        },
    )
    assert p["tau (AF2OBO)"] == 0.5 and p["delta_y, delta_z (AF2OBO)"] == ("theory", "theory")
    assert p["lam_1 (penalty methods)"] == 5.0 and p["K (F2OBO, OBBO)"] == 5
    assert p["gamma (x step, every method)"] == 0.1
    assert p["alpha (z / inner step, every method)"] == 0.1
    assert p["horizons T"] == (100, 300, 1000, 3000) and p["c, mu_g"] == (1.0, 1.0)
    assert fo.COMMON == {"lr_outer": 0.1, "lr_inner": 0.1, "lam1": 5.0}
    assert fo.METHODS == (
        (
            "AF2OBO",
            "af2obo",
            {"tau": 0.5, "delta_y": "theory", "delta_z": "theory", "max_inner_steps": 10_000},
        ),
        ("F2OBO (K = 5)", "f2obo", {"tau": 0.5, "inner_steps": 5}),
        ("OBBO (K = 5)", "obbo", {"inner_steps": 5}),
    )
    for _, solver, hyper in fo.METHODS:  # every setting is a real hyperparameter
        bl.solvers.make(solver, **fo.hyper_for(solver, hyper))
    assert "lam1" not in fo.hyper_for("obbo", {})
    assert fo.stream_of(fo.settings(quick=False)) == {"c": 1.0, "mu_g": 1.0, "x0": 0.5, "y0": 0.0}
    assert fo.settings(quick=True)["horizons T"] == fo.HORIZONS["quick"] == (30, 100, 300)


def test_pzobo_meta_paper_protocol_values_and_methods():
    """PZOBO E4, App. B.4: meta-batch 16, N = 30, inner SGD 0.01 (the code's momentum 0.9),
    mu = 0.1, outer Adam 0.01; the code's ridge 0.5 and warm start; learn2learn's baselines."""
    from bilevel.experiments import pzobo_meta as pm
    from bilevel.meta import registry

    p = pm.PAPER_PROTOCOL
    b4 = "PZOBO paper, App. B.4"
    code = "authors' code, meta_learning.py"
    _sourced(
        p,
        cited={
            "PZOBO meta-batch": b4,
            "PZOBO N (inner steps, also at meta-test)": b4,
            "PZOBO inner lr alpha": b4,
            "PZOBO mu": b4,
            "PZOBO outer lr": b4,
            "PZOBO inner optimizer": code,
            "PZOBO ridge reg": code,
            "PZOBO warm start": code,
            "MAML (and FOMAML) inner lr, steps, outer lr": "learn2learn",
            "ANIL inner lr, steps, outer lr": "learn2learn",
            "ProtoNet outer lr": "learn2learn",
            "training seconds per method": OURS,
            "accuracy thresholds": OURS,
        },
    )
    assert (p["PZOBO meta-batch"], p["PZOBO N (inner steps, also at meta-test)"]) == (16, 30)
    assert (p["PZOBO inner lr alpha"], p["PZOBO mu"], p["PZOBO outer lr"]) == (0.01, 0.1, 0.01)
    assert p["PZOBO ridge reg"] == 0.5 and p["PZOBO inner optimizer"] == "momentum"
    methods = {m.label: m for m in pm.METHODS}
    assert list(methods) == ["PZOBO", "ProtoNet", "ANIL", "MAML", "FOMAML"]
    assert {label: m.meta_batch for label, m in methods.items()} == {
        "PZOBO": 16,
        "ProtoNet": 8,
        "ANIL": 16,
        "MAML": 16,
        "FOMAML": 16,
    }
    pz = registry.make("pzobo", **methods["PZOBO"].hyper)
    assert (pz.inner_steps, pz.lr_inner, pz.smoothing, pz.lr_outer, pz.reg) == (
        30,
        0.01,
        0.1,
        0.01,
        0.5,
    )
    assert pz.inner_optimizer == "momentum" and pz.outer_optimizer == "adam" and pz.warm_start
    maml = registry.make("maml", **methods["MAML"].hyper)
    assert (maml.inner_lr, maml.inner_steps, maml.outer_lr) == (0.02, 5, 3e-4)
    assert registry.make("fomaml", **methods["FOMAML"].hyper).first_order
    anil = registry.make("anil", **methods["ANIL"].hyper)
    assert (anil.inner_lr, anil.inner_steps, anil.outer_lr) == (0.1, 5, 1e-3)
    assert registry.make("protonet", **methods["ProtoNet"].hyper).outer_lr == 5e-3
    full = pm.setting_for(quick=False)
    assert (full.train_seconds, full.eval_every_seconds, full.hidden) == (150.0, 30.0, 32)
    assert (full.eval_tasks, full.final_eval_tasks, full.thresholds) == (200, 600, (0.88, 0.90))
    assert full.meta_batch_cap is None and full.backbone == "cnn4"
    assert pm.run_protocol(full, quick=False) is p
    shown = pm.run_protocol(pm.setting_for(quick=True), quick=True)
    assert shown["training seconds per method"] == 1.0
    assert shown.source("training seconds per method") == "QUICK run (protocol: 150.0)"


def test_f2obo_online_hpo_paper_protocol_values_and_methods():
    """Experiment 2 (F2OBO paper Sec. 6.2, App. A): the stated numbers, and the run's methods
    and sizes read from them."""
    from bilevel.experiments import f2obo_online_hpo as E

    p = E.PAPER_PROTOCOL
    assert (p["rounds T"], p["batch per round (each level)"], p["runs (seeds)"]) == (10_000, 256, 5)
    assert (p["lr_inner alpha (all)"], p["lr_outer gamma (all)"]) == (0.1, 0.001)
    assert (p["SOBBO window w"], p["SOBBO K"]) == (50, 5)
    assert (p["SOGD momentum eta"], p["SOGD linear-system lr beta"]) == (0.9, 0.1)
    assert (p["SF2OBO K"], p["SF2OBO lam_1"], p["SF2OBO tau"]) == (5, 5.0, 1.0)
    assert all(s.source.strip() for s in p.settings.values())
    assert p.source("SF2OBO y step beta_t") == OURS
    assert E.COMMON == {"lr_inner": 0.1, "lr_outer": 0.001}
    assert (E.FULL["horizon"], E.FULL["batch"]) == (10_000, 256)
    assert E.METHODS["SOBBO"][1] == {"window": 50, "inner_steps": 5}
    assert E.METHODS["SOGD"][1] == {"momentum": 0.9, "lr_linear": 0.1}
    sf = E.METHODS["SF2OBO"][1]
    assert (sf["inner_steps"], sf["lam1"], sf["tau"], sf["lr_lagrangian"]) == (5, 5.0, 1.0, 0.1)
    assert f"{E.LAST_FRACTION:.0%}" in p["training loss of Table 3"]
