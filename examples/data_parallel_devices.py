"""Data parallelism: split every minibatch of a run over 4 devices with `bl.solve(devices=4)`.

Task: a run whose minibatches are large (hyper-cleaning of handwritten digits with batches of 256
images, SOBA) is spread over 4 devices: each device computes the loss, gradients and
Hessian-vector products of its quarter of every minibatch and XLA all-reduces the partial sums,
so the iterates match a one-device run up to floating-point summation order. Nothing about the
problem or the solver changes; on a machine with 4 GPUs the same call uses them.

On a CPU, JAX sees one device unless told otherwise, so this script asks for 4 host devices by
setting `XLA_FLAGS=--xla_force_host_platform_device_count=4` in `os.environ` before it imports
jax (docs/distributed.md). They share the CPU's cores, so expect no speed-up here: the point is
that the code and the results are those of a multi-device run.

Method: SOBA (Dagréou, Ablin, Vaiter, Moreau, NeurIPS 2022) on `bl.problems.hyper_cleaning`
(scikit-learn's 8x8 digits, bundled with scikit-learn, 30% of the training labels corrupted).

Run it: `python examples/data_parallel_devices.py` (writes `data_parallel_devices.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` runs 40
outer steps instead of 1500.
"""

import os

# before jax is imported anywhere: 4 host (CPU) devices
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=4"]
).strip()

import pathlib  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

import bilevel as bl  # noqa: E402
from bilevel import data  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
STEPS = 40 if QUICK else 1500
if QUICK:
    print(f"quick mode: {STEPS} outer steps instead of 1500")
print(f"devices: {len(jax.devices())} x {jax.devices()[0].platform}")

X, labels = data.load_sklearn("digits")
X = X / 16.0
y_noisy, corrupted = data.corrupt_labels(labels[:1000], 0.3, 10, seed=0)
problem = bl.problems.hyper_cleaning(
    X[:1000],
    y_noisy,
    X[1000:1400],
    labels[1000:1400],
    num_classes=10,
    X_test=X[1400:],
    y_test=labels[1400:],
    corrupted=corrupted,
)
solver = bl.solvers.make("soba", lr_outer=100.0, lr_inner=0.5, batch_size=256)

runs, seconds = {}, {}
for devices in (None, 4):  # None: one device, as usual
    start = time.perf_counter()
    runs[devices] = bl.solve(
        problem, solver, steps=STEPS, eval_every=STEPS // 10, devices=devices, progress=False
    )
    seconds[devices] = time.perf_counter() - start
one, four = runs[None], runs[4]
print(f"x on 4 devices is replicated: {four.x.sharding.is_fully_replicated}")
diff = float(np.max(np.abs(np.asarray(four.x) - np.asarray(one.x))))
print(
    f"largest difference of the final x, 4 devices vs 1: {diff:.2e} "
    f"(float32 rounding; |x| up to {float(np.max(np.abs(np.asarray(one.x)))):.3g})"
)
h = four.history
print(f"validation loss (4 devices): {h.outer_loss.iloc[0]:.4f} -> {h.outer_loss.iloc[-1]:.4f}")
print(
    f"mean weight of corrupted / clean images: {h.weight_corrupted.iloc[-1]:.3f} / "
    f"{h.weight_clean.iloc[-1]:.3f}"
)
print(
    f"wall time with compilation: 1 device {seconds[None]:.1f} s, 4 devices "
    f"{seconds[4]:.1f} s (4 host devices share this machine's cores)"
)

# ---- figure -------------------------------------------------------------------------------------
fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.plot(one.history["step"], one.history["outer_loss"], "o-", label="1 device")
ax.plot(h["step"], h["outer_loss"], "x--", label="4 devices (devices=4)")
ax.set_xlabel("outer step")
ax.set_ylabel("validation loss")
ax.set_title("SOBA hyper-cleaning: the same run on 1 and 4 devices", fontsize=10)
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "data_parallel_devices.png", dpi=90)
print(f"figure: {OUT / 'data_parallel_devices.png'}")
