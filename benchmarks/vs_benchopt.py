"""Per-step time of ``bilevel`` against benchopt's ``benchmark_bilevel``, side by side.

Both libraries run the same solver with the same oracle work per outer step, on the same arrays
and the same loss functions, in this one process:

* **quadratic**: benchopt's simulated quadratic (``datasets/simulated.py``: n = 1024 samples per
  level, each a (dim_y x dim_y) Hessian, dim_y 100, dim_x 10), arrays from its own generator;
* **data cleaning**: benchopt's ``datasets/mnist.py`` (20,000 training samples with labels
  corrupted at rate 0.5, 5,000 validation samples, multinomial logistic regression without
  intercept, dim_y 7840, one weight logit per training sample, dim_x 20,000, ridge 0.2) on
  Fashion-MNIST (MNIST cannot be downloaded here; the script writes the ``mnist.pkl`` that
  benchopt's loader reads, in a temporary directory).

Ours runs under both sampling schemes of ``bilevel.core.sampling``: ``"window"`` (contiguous rows
at a random start, what benchopt's samplers draw too) and ``"iid"`` (the default); the floor
ratio (``timing.versus_floor``: our chunk over a bare scan of the same oracle calls on the same
kind of batches) is for "window". The quadratic runs twice: with whole minibatches, and with
``BilevelProblem(batch_chunks=8)`` (each minibatch evaluated in 8 parts of 8 rows, each part's
2.5 MB / 8 of Hessians staying in cache between its copy and its products; ``--chunks``).

Before timing, f and g of both sides are evaluated on one batch at a random point and must
agree (relative 1e-5): the same arrays and the same losses. Each pair of compiled programs (a
benchopt ``one_epoch`` of E steps and ``bilevel``'s chunk of E steps) is timed alternately and
the median per-pair ratio printed (``timing.paired_times``); nothing passes or fails on time.

benchopt's solvers: F2SA (10 inner steps: 33 gradients per step), stocBiO (10 inner steps, 10
Neumann HVPs, 1 cross product), TTSA and BSA (Ghadimi & Wang's randomised Neumann product,
p ~ U{0..9} HVPs: ``hessian_inverse="random"`` here), SOBA (one fused pass for grad_y g, the
HVP and the cross product). Ours get the same counts (printed).

Needs a clone of https://github.com/benchopt/benchmark_bilevel (``--benchopt-dir``, else
``$BENCHMARK_BILEVEL_DIR``, else ``./benchmark_bilevel``); without one it says so and exits 0.
Run: ``python benchmarks/vs_benchopt.py [--problems quadratic cleaning] [--solvers f2sa soba]``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import bilevel as bl
import bilevel.data  # noqa: F401  (bl.data: the Fashion-MNIST loader)
from bilevel.core import sampling
from bilevel.problems.models import softmax_cross_entropy

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchopt_side  # noqa: E402
from timing import paired_times, solver_chunk, versus_floor  # noqa: E402

#: benchopt solver file and parameters, our solver name and settings: the same oracle work
SOLVERS = {
    "f2sa": ("f2sa", {"n_inner_steps": 10}, "f2sa", {"inner_steps": 10}),
    "stocbio": (
        "stocbio",
        {"n_inner_steps": 10, "n_shia_steps": 10},
        "stocbio",
        {"inner_steps": 10, "neumann_steps": 10, "neumann_lr": 0.1},
    ),
    "ttsa": (
        "ttsa",
        {"n_hia_steps": 10},
        "ttsa",
        {"neumann_steps": 10, "neumann_lr": 0.1, "hessian_inverse": "random"},
    ),
    "bsa": (
        "bsa",
        {"n_inner_steps": 10, "n_hia_steps": 10},
        "bsa",
        {"inner_steps": 10, "neumann_steps": 10, "neumann_lr": 0.1, "hessian_inverse": "random"},
    ),
    "soba": ("soba", {}, "soba", {}),
}


# ---- the quadratic ---------------------------------------------------------------------------
def quadratic_pair(clone: Path, dim_x: int):
    """benchopt's simulated quadratic and ours on its arrays: ``(pb_inner, pb_outer, problem)``."""
    module = benchopt_side.load(clone, "datasets/simulated.py")
    captured = []

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        captured.append(out)
        return out

    original = module.gen_matrices
    module.gen_matrices = getattr(original, "func", original)  # no joblib disk cache
    original = module.gen_matrices
    module.gen_matrices = recording
    dataset = module.Dataset.__new__(module.Dataset)
    for name, values in module.Dataset.parameters.items():
        setattr(dataset, name, values[0])
    dataset.dim_outer = dim_x
    data = dataset.get_data()
    inner_arrays, outer_arrays = captured[-2], captured[-1]
    problem = _quadratic_problem(inner_arrays, outer_arrays, dataset.dim_inner, dim_x)
    return data["pb_inner"], data["pb_outer"], problem


def _quadratic_problem(inner_arrays, outer_arrays, dim_y, dim_x):
    keys = ("H_yy", "H_xx", "C", "l_y", "l_x")
    inner_data = {k: jnp.asarray(a) for k, a in zip(keys, inner_arrays, strict=True)}
    outer_data = {k: jnp.asarray(a) for k, a in zip(keys, outer_arrays, strict=True)}

    def loss(x, y, batch):
        """mean_i 1/2 y'H_yy,i y + 1/2 x'H_xx,i x + x'C_i y + l_y,i'y + l_x,i'x."""
        Hy = jnp.einsum("bij,j->bi", batch["H_yy"], y)
        Hx = jnp.einsum("bij,j->bi", batch["H_xx"], x)
        Cy = jnp.einsum("bij,j->bi", batch["C"], y)
        per_sample = 0.5 * Hy @ y + 0.5 * Hx @ x + Cy @ x + batch["l_y"] @ y + batch["l_x"] @ x
        return jnp.sum(per_sample) / per_sample.shape[0]

    return bl.BilevelProblem(
        outer=loss,
        inner=loss,
        x0=-2.0 * jnp.ones(dim_x),
        y0=jnp.zeros(dim_y),
        outer_data=outer_data,
        inner_data=inner_data,
        name=f"benchopt quadratic (n 1024, dim_y {dim_y}, dim_x {dim_x})",
    )


# ---- data cleaning ---------------------------------------------------------------------------
def cleaning_pair(clone: Path, workdir: Path, layout: str = "benchopt"):
    """benchopt's MNIST data cleaning on Fashion-MNIST, and ours on the same arrays."""
    train_X, train_y = bl.data.load_fashion_mnist("train")
    test_X, test_y = bl.data.load_fashion_mnist("test")
    raw = {
        "training_images": (train_X.reshape(len(train_X), -1) * 255).round().astype(np.uint8),
        "training_labels": train_y.astype(np.uint8),
        "test_images": (test_X.reshape(len(test_X), -1) * 255).round().astype(np.uint8),
        "test_labels": test_y.astype(np.uint8),
    }
    with open(workdir / "mnist.pkl", "wb") as fh:
        pickle.dump(raw, fh)
    module = benchopt_side.load(clone, "datasets/mnist.py")
    dataset = module.Dataset.__new__(module.Dataset)
    for name, values in module.Dataset.parameters.items():
        setattr(dataset, name, values[0])
    here = os.getcwd()
    os.chdir(workdir)
    try:
        data = dataset.get_data()
    finally:
        os.chdir(here)
    problem = _cleaning_problem(raw, dataset.random_state, dataset.ratio, dataset.reg, layout)
    return data["pb_inner"], data["pb_outer"], problem


def _cleaning_arrays(raw, random_state, ratio):
    """The arrays benchopt's loader builds (same calls, same random state, in the same order)."""
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    rng = np.random.RandomState(random_state)
    X_train, X_val, y_train, y_val = train_test_split(
        raw["training_images"],
        raw["training_labels"].copy(),
        test_size=5000,
        train_size=20000,
        random_state=rng,
    )
    corrupted = rng.rand(len(y_train)) < ratio
    y_train[corrupted] = rng.randint(0, 10, np.sum(corrupted))
    scaler = StandardScaler()
    X_train = scaler.fit_transform(X_train)
    X_val = scaler.transform(X_val)
    return X_train, y_train, X_val, y_val


def _cleaning_problem(raw, random_state, ratio, reg, layout):
    """Ours. ``layout="benchopt"``: y is W (d x C) flattened, as benchopt's; ``"transposed"``:
    y is W^T (C x d) flattened, the same problem with y's coordinates permuted, whose
    x-gradients and y-gradients XLA:CPU computes 2.4x faster (the gradient of a (d x C) weight
    is a matrix product with a 10-wide output; of a (C x d) one, a 784-wide output)."""
    X_train, y_train, X_val, y_val = _cleaning_arrays(raw, random_state, ratio)
    n, d = X_train.shape
    classes = 10

    def weights(y):
        return y.reshape(d, classes) if layout == "benchopt" else y.reshape(classes, d).T

    def cross_entropy(y, batch):  # the library's (bl.problems.models)
        return softmax_cross_entropy(batch["X"] @ weights(y), batch["label"])

    def inner(x, y, batch):  # mean_i sigmoid(x_i) CE_i(y) + reg ||y||^2
        weights = jax.nn.sigmoid(x[batch["index"]])
        return jnp.mean(weights * cross_entropy(y, batch)) + reg * jnp.sum(y**2)

    def outer(x, y, batch):
        return jnp.mean(cross_entropy(y, batch))

    f32 = jnp.float32
    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=-2.0 * jnp.ones(n, f32),
        y0=jnp.zeros(d * classes, f32),
        outer_data={"X": jnp.asarray(X_val, f32), "label": jnp.asarray(y_val, jnp.int32)},
        inner_data={
            "X": jnp.asarray(X_train, f32),
            "label": jnp.asarray(y_train, jnp.int32),
            "index": jnp.arange(n, dtype=jnp.int32),
        },
        name=f"benchopt data cleaning (Fashion-MNIST, n {n}, dim_y {d * classes}, dim_x {n}), "
        f"y layout: {layout}",
        reference=(d, classes, layout),
    )


# ---- checks and timing -----------------------------------------------------------------------
def check_same_functions(pb_inner, pb_outer, problem, batch: int) -> float:
    """The largest relative gap of f and g between the two sides on rows [0, batch)."""
    key_x, key_y = jax.random.split(jax.random.PRNGKey(7))
    x = problem.x0 + 0.1 * jax.random.normal(key_x, problem.x0.shape, problem.x0.dtype)
    y = 0.1 * jax.random.normal(key_y, problem.y0.shape, problem.y0.dtype)
    gaps = []
    for (fn, *_), ours, data in (
        (pb_inner, problem.inner, problem.inner_data),
        (pb_outer, problem.outer, problem.outer_data),
    ):
        rows = sampling.split_rows(jax.tree.map(lambda a: a[:batch], data), problem.batch_chunks)
        theirs = float(fn(y, x, start=0, batch_size=batch))  # benchopt: (inner, outer) order
        mine = float(ours(x, _our_layout(problem, y), rows))
        gaps.append(abs(theirs - mine) / max(abs(theirs), 1e-30))
    return max(gaps)


def _our_layout(problem, y):
    """benchopt's flat (d x C) y in our problem's layout."""
    if problem.reference is None or problem.reference[2] == "benchopt":
        return y
    d, classes, _ = problem.reference
    return y.reshape(d, classes).T.reshape(-1)


def compare(name, clone, pb_inner, pb_outer, problem, args):
    """One table row: benchopt's time per step, ours under each sampling scheme, the ratios."""
    file, their_params, ours, our_params = SOLVERS[name]
    one_epoch, carry = benchopt_side.make_solver(
        clone,
        file,
        pb_inner,
        pb_outer,
        problem.y0,
        problem.x0,
        batch_size=args.batch,
        eval_freq=args.steps,
        **their_params,
    )
    steps, row = args.steps, {}
    for scheme in ("window", "iid"):
        scheme_problem = problem.replace(sampling=scheme)
        solver = bl.solvers.make(
            ours, batch_size=args.batch, lr_outer=1e-3, lr_inner=1e-2, **our_params
        ).resolve(scheme_problem)
        run_ours, state = solver_chunk(scheme_problem, solver, steps, 1)
        t_theirs, t_ours, ratio = paired_times(
            lambda: one_epoch(carry, steps), run_ours, args.repeats
        )
        row[scheme] = (t_theirs, t_ours, ratio)
        if scheme == "window":
            *_, floor, calls = versus_floor(
                scheme_problem, solver, run_ours, state, args.batch, steps, args.repeats
            )
    work = ", ".join(f"{k} {v}" for k, v in calls.items() if v)
    t_theirs, t_ours, ratio = row["window"]
    # a random Neumann product makes p ~ U{0..N-1} HVPs; the floor makes the N - 1 declared
    random_work = our_params.get("hessian_inverse") == "random"
    floor_cell = f"{'(random)':>11s}" if random_work else f"{floor:11.2f}"
    if random_work:
        work = work.replace("hvp ", "hvp <= ")
    print(
        f"{name:8s} {t_theirs / steps * 1e6:11,.0f} {t_ours / steps * 1e6:11,.0f} "
        f"{ratio:10.2f} {row['iid'][1] / steps * 1e6:11,.0f} {row['iid'][2]:10.2f} "
        f"{floor_cell}   {work}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchopt-dir", default=None)
    parser.add_argument("--problems", nargs="*", default=["quadratic", "cleaning"])
    parser.add_argument("--solvers", nargs="*", default=list(SOLVERS))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=128, help="steps per timed epoch")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--dim-x", type=int, default=10, help="quadratic: dim_x")
    parser.add_argument(
        "--chunks",
        type=int,
        nargs="*",
        default=[1, 8],
        help="quadratic: our BilevelProblem(batch_chunks=...), one table each",
    )
    parser.add_argument(
        "--layout",
        nargs="*",
        default=["benchopt", "transposed"],
        help="data cleaning: our y as benchopt's W (d x C), or as W^T (C x d)",
    )
    args = parser.parse_args()
    clone = benchopt_side.find_clone(args.benchopt_dir)
    if clone is None:
        print(
            "benchopt's benchmark_bilevel not found: clone it with "
            f"`{benchopt_side.CLONE_HINT}` beside this checkout, or pass --benchopt-dir / set "
            "$BENCHMARK_BILEVEL_DIR. Skipping."
        )
        return
    print(
        f"benchopt clone: {clone}; jax {jax.__version__}, devices {jax.devices()}, "
        f"batch {args.batch}, {args.steps} steps per timed epoch, {args.repeats} alternated pairs; "
        "us = microseconds per outer step"
    )
    cases = [("quadratic", k) for k in args.chunks if "quadratic" in args.problems]
    if "cleaning" in args.problems:
        cases += [("cleaning", layout) for layout in args.layout]
    with tempfile.TemporaryDirectory() as tmp:
        for which, variant in cases:
            if which == "quadratic":
                pb_inner, pb_outer, problem = quadratic_pair(clone, args.dim_x)
                problem = problem.replace(
                    batch_chunks=variant, name=f"{problem.name}, batch_chunks {variant}"
                )
            else:
                try:
                    pb_inner, pb_outer, problem = cleaning_pair(clone, Path(tmp), variant)
                except bl.data.DatasetNotFoundError as err:
                    print(f"data cleaning skipped: Fashion-MNIST not found ({err}).")
                    break
            gap = check_same_functions(pb_inner, pb_outer, problem, args.batch)
            print(f"\n{problem.name}: f and g agree on one batch, largest relative gap {gap:.1e}")
            if gap > 1e-5:
                raise SystemExit("the two sides do not compute the same f and g; not timing.")
            header = (
                f"{'solver':8s} {'benchopt us':>11s} {'window us':>11s} {'bo/window':>10s} "
                f"{'iid us':>11s} {'bo/iid':>10s} {'win/floor':>11s}   oracle calls per step"
            )
            print(header + "\n" + "-" * len(header))
            for name in args.solvers:
                compare(name, clone, pb_inner, pb_outer, problem, args)


if __name__ == "__main__":
    main()
