"""The budget helpers of the reproduction experiments (``experiments.common``)."""

import pandas as pd

import bilevel as bl
from bilevel.experiments.common import Method, steps_within, within_budget


def test_within_budget_keeps_the_evaluations_inside_the_seed_mean_time():
    h = pd.DataFrame(
        {"seed": [0, 1] * 3, "step": [0, 0, 10, 10, 20, 20], "seconds": [0, 0, 1, 3, 3, 5]}
    )
    assert within_budget(h, 2.0).step.tolist() == [0, 0, 10, 10]  # step 10: mean 2 s
    assert within_budget(h, 3.9).step.tolist() == [0, 0, 10, 10]
    assert within_budget(h, 4.0).step.tolist() == [0, 0, 10, 10, 20, 20]


def test_steps_within_is_clipped_to_the_pilot_and_to_max_steps():
    """Timing-free bounds: no budget is met by fewer than the pilot's steps, and an unbounded
    budget runs max_steps."""
    problem = bl.problems.quadratic(dx=3, dy=4)
    method = Method("gd", "stocbio", {"lr_outer": 0.1}, 1, 1)
    assert steps_within(problem, method, 1e-12, max_steps=500, pilot=40) == 40
    assert steps_within(problem, method, 1e12, max_steps=500, pilot=40) == 500
    assert steps_within(problem, method, 1.0, max_steps=20, pilot=40) == 20
