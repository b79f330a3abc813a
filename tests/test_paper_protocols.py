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
