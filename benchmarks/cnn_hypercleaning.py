"""Hyper-cleaning with the LeNet-5 CNN on all 60,000 Fashion-MNIST training images.

``bl.problems.hyper_cleaning_dataset(model="cnn")`` with 59,000 noisy training images (dim x =
59,000: one weight per image, corruption p = 0.1) and 1,000 clean validation images (all 60,000
of the training split), test on the 10,000 test images; y is LeNet-5 and a linear head
(61,706 parameters). F2SA, batch 64, ``--steps`` outer steps through ``bl.solve``. Prints

* time per step (steady state: from the history's solver seconds, compilation excluded) and
  the validation / test accuracy along the way;
* memory: the data's bytes, XLA's estimate of one compiled F2SA step
  (``memory_analysis()``: argument, output, temp bytes) and this process's peak RSS
  (``ru_maxrss``; run the script alone, it is a fresh process);
* that no per-sample Jacobian is formed: the step's temp bytes at n = 59,000 against n / 4, next
  to what a per-sample (n x dim y) Jacobian of the extra samples would take.

Why none can be formed: the x-gradient of the weighted mean loss ``g = (1/B) sum_i
sigmoid(x_{idx_i}) CE_i(y) + c ||y||^2`` is ``d g / d x_j = (1/B) sum_{i: idx_i = j}
sigmoid'(x_j) CE_i(y)``, which needs only the B per-sample loss *values*: reverse mode pulls the
cotangent of the mean back through the weights (a gather, whose transpose is a scatter-add of
B numbers into a zero n-vector) and never through the network for x. Its y-gradient is one
backward pass in which the batch axis is contracted inside each layer's weight-gradient
product, so per-sample gradients (B x dim y) never exist either. ``tests/test_memory.py``
checks the temp-bytes claim on every run of the suite.

With the Fashion-MNIST files absent (``apt-get install dataset-fashion-mnist``), the script
says so and runs the same sizes on synthetic Gaussian images (same shapes, so the same time and
memory; accuracies then mean nothing). Nothing passes or fails.
Run: ``python benchmarks/cnn_hypercleaning.py [--steps 200] [--compute-dtype bfloat16]``.
"""

from __future__ import annotations

import argparse
import warnings

import jax
import numpy as np
from memory import MB, data_bytes, device_peak_bytes, dim, peak_rss_bytes, rss_bytes, step_memory

import bilevel as bl
from bilevel import data as bl_data

N_TRAIN, N_VAL, N_TEST = 59_000, 1_000, 10_000


def problem(n_train: int, compute_dtype, real: bool) -> bl.BilevelProblem:
    options = {"model": "cnn", "compute_dtype": compute_dtype}
    if real:
        return bl.problems.hyper_cleaning_dataset(
            "fashion_mnist", n_train=n_train, n_val=N_VAL, n_test=N_TEST, **options
        )
    rng = np.random.default_rng(0)  # the stand-in: same shapes, Gaussian pixels
    X = rng.standard_normal((n_train + N_VAL, 784), dtype=np.float32)
    y = rng.integers(0, 10, n_train + N_VAL)
    return bl.problems.hyper_cleaning(
        X[:n_train], y[:n_train], X[n_train:], y[n_train:], num_classes=10, **options
    )


def have_fashion_mnist() -> bool:
    try:
        bl_data.load_fashion_mnist("test")
    except bl_data.DatasetNotFoundError as err:
        print(f"Fashion-MNIST not found ({err}); stand-in: synthetic Gaussian 28x28 images.")
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--compute-dtype", default=None, help="None (float32) or bfloat16")
    args = parser.parse_args()
    real = have_fashion_mnist()
    rss_start = rss_bytes()
    prob = problem(N_TRAIN, args.compute_dtype, real)
    rss_problem = rss_bytes()
    solver = bl.solvers.make("f2sa", lr_outer=0.5, lr_inner=0.05, batch_size=args.batch)
    print(
        f"{prob.name}: dim x {dim(prob.x0):,}, dim y {dim(prob.y0):,}, data "
        f"{data_bytes(prob) / MB:.0f} MB; F2SA, batch {args.batch}, {args.steps} steps"
    )
    with warnings.catch_warnings(record=True) as caught:  # LeNet-5 is not convex in y
        warnings.simplefilter("always", bl.NotStronglyConvexWarning)
        res = bl.solve(prob, solver, args.steps, eval_every=max(args.steps // 4, 1), progress=False)
    for w in caught:
        print(f"(warning: {str(w.message).split(';')[0]})")
    h = res.history
    print(h[["step", "seconds", "val_loss", "val_acc", "test_acc"]].to_string(index=False))
    per_step = (h["seconds"].iloc[-1] - h["seconds"].iloc[0]) / (
        h["step"].iloc[-1] - h["step"].iloc[0]
    )
    print(
        f"time per step: {per_step * 1e3:.1f} ms "
        "(solver seconds / steps: compilation and evaluations excluded)"
    )
    peak_run = peak_rss_bytes()
    peak_device = device_peak_bytes()

    small = problem(N_TRAIN // 4, args.compute_dtype, real)
    mem, _, _ = step_memory(prob, solver)
    mem_small, _, _ = step_memory(small, solver)
    jacobian = (N_TRAIN - N_TRAIN // 4) * dim(prob.y0) * prob.x0.dtype.itemsize
    print(
        f"memory: RSS {rss_start / MB:.0f} MB before the data, {rss_problem / MB:.0f} MB with the "
        f"problem built, peak {peak_run / MB:.0f} MB over the run (ru_maxrss)"
        + (
            ""
            if peak_device is None
            else f"; {jax.devices()[0].device_kind} peak "
            f"{peak_device / MB:.0f} MB (its allocator's peak_bytes_in_use)"
        )
        + "\n"
        f"XLA, one F2SA step at n = {N_TRAIN:,}: arguments {mem.argument / MB:.1f} MB, output "
        f"{mem.output / MB:.2f} MB, temp {mem.temp / MB:.2f} MB; at n = {N_TRAIN // 4:,}: temp "
        f"{mem_small.temp / MB:.2f} MB. Growth {(mem.temp - mem_small.temp) / MB:.3f} MB for "
        f"{N_TRAIN - N_TRAIN // 4:,} more samples, against {jacobian / MB:,.0f} MB for their "
        "per-sample gradients (n x dim y)."
    )


if __name__ == "__main__":
    main()
