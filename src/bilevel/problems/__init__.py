"""Problems: the closed-form quadratic family and the papers' experiment problems.

``bl.problems.names()`` lists the problems the CLI can build by name; ``bl.problems.make(name,
**options)`` builds one. The online streams (``drifting_quadratic``, ``oscillating``: closed-form
``bl.OnlineProblem``s for ``bl.solve_online``; ``imbalanced_stream`` and ``online_l2_hpo``, the
F2OBO paper's two experiments) are built by their functions and are not in that
list, which ``bilevel run`` (offline) draws from.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from bilevel.problems.coreset_toy import CoresetReference, coreset_toy
from bilevel.problems.drifting_quadratic import DriftingQuadraticReference, drifting_quadratic
from bilevel.problems.hyper_cleaning import (
    hyper_cleaning,
    hyper_cleaning_dataset,
    retrain,
    train_without_bilevel,
)
from bilevel.problems.hyper_representation import (
    deep_hyper_representation,
    deep_hyper_representation_dataset,
    hyper_representation,
    hyper_representation_synthetic,
    synthetic_hyperrep_data,
)
from bilevel.problems.imbalanced_stream import imbalanced_stream
from bilevel.problems.l2_hpo import (
    l2_hpo_linear,
    l2_hpo_linear_dataset,
    l2_hpo_logistic,
    l2_hpo_logistic_dataset,
)
from bilevel.problems.matrix_completion import MatrixCompletionReference, matrix_completion
from bilevel.problems.online_hpo import online_l2_hpo
from bilevel.problems.oscillating import OscillatingReference, oscillating
from bilevel.problems.quadratic import QuadraticReference, quadratic

__all__ = [
    "imbalanced_stream",
    "online_l2_hpo",
    "quadratic",
    "QuadraticReference",
    "coreset_toy",
    "CoresetReference",
    "hyper_cleaning",
    "hyper_cleaning_dataset",
    "train_without_bilevel",
    "retrain",
    "hyper_representation",
    "hyper_representation_synthetic",
    "synthetic_hyperrep_data",
    "deep_hyper_representation",
    "deep_hyper_representation_dataset",
    "l2_hpo_logistic",
    "l2_hpo_logistic_dataset",
    "l2_hpo_linear",
    "l2_hpo_linear_dataset",
    "matrix_completion",
    "MatrixCompletionReference",
    "drifting_quadratic",
    "DriftingQuadraticReference",
    "oscillating",
    "OscillatingReference",
    "make",
    "names",
    "register",
    "describe",
    "solver_hints",
]

_PROBLEMS: dict[str, tuple[Callable, str]] = {}
_HINTS: dict[str, dict] = {}


def register(name: str, factory: Callable, description: str, hints: dict | None = None) -> None:
    """Register ``factory`` under ``name``; ``hints`` are step sizes known to suit it."""
    _PROBLEMS[name] = (factory, description)
    _HINTS[name] = dict(hints or {})


def solver_hints(name: str) -> dict:
    """Suggested ``lr_outer`` / ``lr_inner`` (from the problem's constants) for the CLI."""
    return dict(_HINTS.get(name, {}))


def names() -> list[str]:
    return sorted(_PROBLEMS)


def describe(name: str) -> str:
    return _PROBLEMS[name][1]


def make(name: str, **options):
    """Build the registered problem ``name`` with ``options`` passed to its factory."""
    if name not in _PROBLEMS:
        close = difflib.get_close_matches(name, _PROBLEMS, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown problem {name!r}.{hint} Known problems: {', '.join(names())}.")
    return _PROBLEMS[name][0](**options)


register(
    "quadratic",
    quadratic,
    "closed-form quadratic bilevel problem (dx=10, dy=50, inner condition number 10); "
    "deterministic",
    hints={"lr_outer": 0.05, "lr_inner": 0.1},
)
register(
    "quadratic-stochastic",
    lambda **kw: quadratic(stochastic=True, **kw),
    "finite-sum version of 'quadratic' (2000 samples per level; noisy gradients, Hessians "
    "and cross derivatives)",
    hints={"lr_outer": 0.05, "lr_inner": 0.05},
)
register(
    "coreset-toy",
    coreset_toy,
    "IBCG Sec. 5.1 2-D coreset toy on the 4-simplex (mu_g=1 by default, L_g=4; A and the "
    "points are documented choices); deterministic, closed form",
)
register(
    "hyper-cleaning",
    hyper_cleaning_dataset,
    "F2SA Sec. 5 data hyper-cleaning, mean form: 19,000 noisy (p=0.1) + 1,000 clean "
    "Fashion-MNIST images, multinomial logistic regression, c=0.01",
    hints={"lr_outer": 100.0, "lr_inner": 0.05},
)
register(
    "l2-hpo-logistic",
    l2_hpo_logistic_dataset,
    "STABLE eq. (32): per-feature L2 (sum x_i y_i^2, x in Box[1e-3, 10]) of logistic "
    "regression; breast_cancer by default (dataset=australian|ijcnn1|covtype)",
    hints={"lr_outer": 0.5, "lr_inner": 0.2},
)
register(
    "l2-hpo-logistic-exp",
    lambda **kw: l2_hpo_logistic_dataset(form="exp", **kw),
    "as l2-hpo-logistic with sum exp(x_i) y_i^2 (unconstrained)",
    hints={"lr_outer": 0.5, "lr_inner": 0.1},
)
register(
    "l2-hpo-linear",
    l2_hpo_linear_dataset,
    "PZOBO E5 / hypertorch: L2 per feature of a linear softmax classifier; digits by "
    "default (dataset=20newsgroups)",
    hints={"lr_outer": 100.0, "lr_inner": 1.0},
)
register(
    "hyperrep-linear",
    lambda **kw: hyper_representation_synthetic("linear", **kw),
    "PZOBO E1: linear hyper-representation, m=64, d=128, n=500, gamma=0.1; exact grad_norm",
    hints={"lr_outer": 0.05, "lr_inner": 0.001},
)
register(
    "hyperrep-2layer",
    lambda **kw: hyper_representation_synthetic("2layer", **kw),
    "PZOBO E2: two-layer sigmoid hyper-representation, 256-512-256, n=5000, gamma=0.001",
    hints={"lr_outer": 0.01, "lr_inner": 0.001},
)
register(
    "deep-hyperrep",
    deep_hyper_representation_dataset,
    "PZOBO E3: LeNet-5 features (outer) + linear head (inner), Fashion-MNIST test->inner, "
    "train->outer",
    hints={"lr_outer": 0.001, "lr_inner": 1.0},
)
register(
    "matrix-completion",
    matrix_completion,
    "IBCG Sec. 5.2 matrix completion with denoising: 250x250 rank 10, nuclear ball of radius "
    "||X_hat||_*, pseudo-Huber (delta=0.9), summed data terms (kappa_g = 21.5); deterministic "
    "(stochastic=True: minibatches of observed entries)",
    hints={"lr_inner": 0.8},
)
register(
    "matrix-completion-mean",
    lambda **kw: matrix_completion(scaling="mean", **kw),
    "as matrix-completion with the paper's literal mean data terms (1/|Omega|; kappa_g ~ 1.5, "
    "the data term is negligible and X drifts to 0)",
    hints={"lr_inner": 7.5},
)
