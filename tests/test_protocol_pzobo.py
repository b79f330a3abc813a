"""The paper protocol of PZOBO's E3 (issue #35): its stated values, and that the methods the
experiment builds get them (a typo in a step size or a dropped schedule fails here)."""

import numpy as np

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
