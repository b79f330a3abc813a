"""Every offline solver with its defaults on problems nobody tuned them for (issue: defaults).

Five small scikit-learn problems built the way a new user would build them:

- ``ridge``: diabetes regression with a per-feature ridge penalty ``exp(x_j) w_j^2`` (x in R^10);
- ``ridge_raw``: the same written otherwise (halved losses, targets not centred, another
  split), which ends far more ill-conditioned (:func:`ridge_raw`);
- ``logistic``: breast-cancer logistic regression with one log-penalty ``exp(x) ||w||^2``;
- ``logistic_split``: the same with the penalty halved and another split;
- ``cleaning``: wine softmax regression with 30% of the training labels corrupted and one
  weight ``sigmoid(x_i)`` per training sample (data hyper-cleaning, x in R^106);
- ``cleaning_digits`` (only with ``--problems cleaning_digits``): the same on 300 digits with
  40% corrupted, ``y`` of 650 entries (:func:`cleaning_digits`),

each deterministic (full batches) and with minibatches (32, 32, 64, 64, 32). Every solver of
``bl.solvers.names()`` runs ``bl.solve(problem, bl.solvers.make(name, batch_size=...),
steps=3000)`` with nothing else set (PZOBO-S and SABA need minibatches: they get them in both
columns); the Frank-Wolfe methods (IBCG, SBFW) get the box ``[-3, 3]^d`` as ``x_set``.
Printed per run: ``||grad F(x_K)|| / ||grad F(x_0)||`` (exact, ``bl.metrics.hypergradient``;
the FW gap for the Frank-Wolfe methods), whether it diverged, the chosen ``lr_outer``, and the
seconds the tuning took as a share of the whole solve. Nothing passes or fails on time.

Run: ``python benchmarks/defaults.py [--problems ridge logistic] [--solvers f2sa aid-cg]
[--batches full|mini]``.
On a machine with many cores, one process per problem and solver (docs/step_sizes.md's table:
16 cores, 153 s)::

    for p in cleaning logistic logistic_split ridge ridge_raw; do for s in $(python -c \\
      "import bilevel as bl; print(*bl.solvers.names())"); do echo $p $s; done; done \\
      | JAX_PLATFORMS=cpu xargs -P 16 -L 1 \\
      sh -c 'python benchmarks/defaults.py --problems $0 --solvers $1 | tail -n +2'
"""

from __future__ import annotations

import argparse
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits, load_wine

import bilevel as bl

jax.config.update("jax_enable_x64", True)
STEPS = 3000


def _standardise(X):
    X = np.asarray(X, float)
    return (X - X.mean(0)) / (X.std(0) + 1e-12)


def _split(X, y, share, seed=0):
    order = np.random.default_rng(seed).permutation(len(X))
    n = int(share * len(X))
    first, rest = order[:n], order[n:]
    return X[first], y[first], X[rest], y[rest]


def _data(X, y, **extra):
    return {"X": jnp.asarray(X), "Y": jnp.asarray(y), **extra}


def _diabetes_ridge(name: str, *, centre: bool, scale: float, seed: int):
    """Diabetes regression with a per-feature penalty ``exp(x_j) w_j^2``, both losses times
    ``scale``, targets scaled (and centred with ``centre``), a 60/40 split drawn with ``seed``."""
    X, y = load_diabetes(return_X_y=True)
    X, y = _standardise(X), ((y - y.mean()) if centre else y) / y.std()
    Xt, yt, Xv, yv = _split(X, y, 0.6, seed=seed)

    def inner(x, w, b):
        return scale * (jnp.mean((b["X"] @ w - b["Y"]) ** 2) + jnp.sum(jnp.exp(x) * w**2))

    def outer(x, w, b):
        return scale * jnp.mean((b["X"] @ w - b["Y"]) ** 2)

    d = X.shape[1]
    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros(d),
        y0=jnp.zeros(d),
        outer_data=_data(Xv, yv),
        inner_data=_data(Xt, yt),
        name=name,
    )


def ridge():
    return _diabetes_ridge("ridge", centre=True, scale=1.0, seed=0)


def ridge_raw():
    """``ridge`` as a user might write it otherwise: halved losses, targets scaled but not
    centred (there is no intercept), another split. Its penalties end near ``exp(x_j) ~ 1000``
    with ``L_g / mu_g ~ 1850`` at ``x*`` (``ridge``: 195), which the methods that truncate the
    inner solve or the adjoint feel as a bias (ITD, stocBiO and PZOBO until their counts
    followed the falling inner step, AID-FP until its adjoint started warm)."""
    return _diabetes_ridge("ridge_raw", centre=False, scale=0.5, seed=7)


def _breast_cancer_logistic(name: str, *, penalty: float, seed: int):
    """Breast-cancer logistic regression (labels +-1) with one log-penalty
    ``penalty exp(x) ||w||^2``, a 50/50 split drawn with ``seed``."""
    X, y = load_breast_cancer(return_X_y=True)
    X, y = _standardise(X), 2.0 * y - 1.0
    Xt, yt, Xv, yv = _split(X, y, 0.5, seed=seed)

    def loss(w, b):
        return jnp.mean(jax.nn.softplus(-b["Y"] * (b["X"] @ w)))

    def inner(x, w, b):
        return loss(w, b) + penalty * jnp.exp(x[0]) * jnp.sum(w**2)

    def outer(x, w, b):
        return loss(w, b)

    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros(1),
        y0=jnp.zeros(X.shape[1]),
        outer_data=_data(Xv, yv),
        inner_data=_data(Xt, yt),
        name=name,
    )


def logistic():
    return _breast_cancer_logistic("logistic", penalty=1.0, seed=0)


def logistic_split():
    """``logistic`` with the penalty halved and another split: F2SA and F3SA miss here with
    batches of 64 (docs/step_sizes.md)."""
    return _breast_cancer_logistic("logistic_split", penalty=0.5, seed=5)


def cleaning():
    X, y = load_wine(return_X_y=True)
    Xt, yt, Xv, yv = _split(_standardise(X), y, 0.6, seed=1)
    rng = np.random.default_rng(2)
    n = len(Xt)
    yt = np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), yt)

    def cross_entropy(w, b):
        logits = jax.nn.log_softmax(b["X"] @ w)
        return -jnp.take_along_axis(logits, b["Y"][:, None], 1)[:, 0]

    def inner(x, w, b):
        return jnp.mean(jax.nn.sigmoid(x[b["i"]]) * cross_entropy(w, b)) + 0.01 * jnp.sum(w**2)

    def outer(x, w, b):
        return jnp.mean(cross_entropy(w, b))

    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros(n),
        y0=jnp.zeros((13, 3)),
        outer_data=_data(Xv, yv),
        name="cleaning",
        inner_data=_data(Xt, yt, i=jnp.arange(n)),
    )


def cleaning_digits():
    """The hyper-cleaning of docs/step_sizes.md's "Outside the table": 300 training digits of
    scikit-learn's 8 x 8 set with 40% of their labels replaced by another class, 300 clean ones
    for validation, pixels standardised by the training set's, a softmax regression (``y``: 64 x
    10 weights and 10 biases, above the tuning's exact-score limit) with inner ridge ``1e-3``
    (:func:`bilevel.problems.hyper_cleaning`). Not in the default run."""
    X, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(X))[:600]
    X, y = X[order].astype(float), y[order]
    Xt, yt, Xv, yv = X[:300], y[:300].copy(), X[300:], y[300:]
    mean, std = Xt.mean(0), Xt.std(0) + 1e-12
    corrupted = rng.random(300) < 0.4
    yt[corrupted] = (yt[corrupted] + rng.integers(1, 10, corrupted.sum())) % 10
    return bl.problems.hyper_cleaning(
        (Xt - mean) / std, yt, (Xv - mean) / std, yv, num_classes=10, c=1e-3
    )


PROBLEMS = {
    "ridge": (ridge, 32),
    "ridge_raw": (ridge_raw, 32),
    "logistic": (logistic, 64),
    "logistic_split": (logistic_split, 64),
    "cleaning": (cleaning, 32),
    "cleaning_digits": (cleaning_digits, 32),
}
#: the table of docs/step_sizes.md (``cleaning_digits`` only on request: its y is 10x larger)
DEFAULT_PROBLEMS = ["ridge", "ridge_raw", "logistic", "logistic_split", "cleaning"]


def measure(problem, x) -> float:
    """||grad F(x)||, or the FW gap when the problem has a bounded x_set."""
    if problem.x_set is not None:
        return float(bl.metrics.fw_gap(problem, x))
    return float(jnp.linalg.norm(bl.metrics.hypergradient(problem, x)))


def run(problem, name: str, batch_size) -> str:
    if bl.solvers.get(name).needs_bounded_set:
        problem = problem.replace(x_set=bl.sets.Box(-3.0, 3.0))
    solver = bl.solvers.make(name, batch_size=batch_size)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bl.solve(problem, solver, steps=STEPS, progress=False)
    seconds = time.perf_counter() - t0
    ratio = measure(problem, res.x) / measure(problem, problem.x0)
    tuning = res.tuning
    lr = f"{tuning.value:8.2g}" if tuning else "    rule"  # IBCG's and SBFW's own step rules
    share = f"{tuning.seconds / seconds:5.0%}" if tuning else "    -"
    return f"{ratio:8.3f} {'ok' if res.ok else 'DIV':>4} {lr} {share} {seconds:6.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", nargs="*", default=DEFAULT_PROBLEMS, choices=list(PROBLEMS))
    parser.add_argument("--solvers", nargs="*", default=bl.solvers.names())
    parser.add_argument(
        "--batches",
        choices=("both", "full", "mini"),
        default="both",
        help="the full-batch rows, the minibatch rows, or both (default)",
    )
    args = parser.parse_args()
    kinds = ("full", "mini") if args.batches == "both" else (args.batches,)
    print("problem   batch solver     ratio  run  lr_outer tune% seconds")
    for which in args.problems:
        build, batch = PROBLEMS[which]
        problem = build()
        for batch_size in (batch if kind == "mini" else None for kind in kinds):
            for name in args.solvers:
                size = batch if name in ("pzobo-s", "saba") else batch_size
                line = run(problem, name, size)
                print(f"{which:9s} {size or 'full':>5} {name:8s} {line}", flush=True)


if __name__ == "__main__":
    main()
