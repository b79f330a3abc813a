"""Clean noisy labels by learning one weight per training image (data hyper-cleaning).

Task: a softmax classifier on Fashion-MNIST whose training labels are 30% wrong, with a small
clean validation set. One logit x_i per training image gives it the weight sigmoid(x_i); the
weights are tuned so that the classifier trained on the weighted data does well on the clean
validation images (Franceschi et al., ICML 2017; the mean form of F2SA's Sec. 5):

    min_x  mean_val CE(w*(x); a, b)
    s.t.   w*(x) = argmin_w  mean_train sigmoid(x_i) CE(w; a_i, b~_i) + c ||w||^2

A working method drives the weights of the corrupted images toward 0 and keeps the clean ones.

Method: F2SA (Kwon, Kwon, Wright, Nowak, "A Fully First-Order Method for Stochastic Bilevel
Optimization", ICML 2023): first-order only, minibatches of 128 with one shared sample for
both x-gradients (the paper's Appendix C), the problem built by `bl.problems.hyper_cleaning`.

Data: Fashion-MNIST when it is installed (`apt-get install dataset-fashion-mnist`, or the IDX
files in `$BILEVEL_DATA/fashion-mnist`), else scikit-learn's 8x8 digits as a stand-in.
`BILEVEL_IGNORE_SYSTEM_DATA=1` ignores the system-wide copy, as every loader of the library
does, to show the stand-in path. The script prints which data it used.

Run it: `python examples/hyper_cleaning_fashion_mnist.py` (writes
`hyper_cleaning_fashion_mnist.png` to `$BILEVEL_EXAMPLES_OUT`, default the current directory).
`BILEVEL_EXAMPLES_QUICK=1` uses 1,000 training images instead of 5,000 (digits: 600 instead of
1,000) and 150 outer steps instead of 2,000.
"""

import os
import pathlib

import jax
import matplotlib
import numpy as np

import bilevel as bl
from bilevel import data

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
STEPS = 150 if QUICK else 2000
NOISE = 0.3
if QUICK:
    print(
        "quick mode: 1,000 training images instead of 5,000 (digits: 600 of 1,000), "
        f"{STEPS} outer steps instead of 2,000"
    )

# ---- data: Fashion-MNIST, or scikit-learn digits when it is not installed ------------------------
try:
    images, labels = data.load_fashion_mnist("train")
    test_images, test_labels = data.load_fashion_mnist("test")
    name, n_train, n_val, n_test = "Fashion-MNIST", 5000, 1000, 2000
    if QUICK:
        n_train, n_val, n_test = 1000, 300, 500
except data.DatasetNotFoundError:
    digits, digit_labels = data.load_sklearn("digits")  # bundled with scikit-learn
    images, labels = digits / 16.0, digit_labels
    test_images, test_labels = images[1400:], labels[1400:]
    images, labels = images[:1400], labels[:1400]
    name, n_train, n_val, n_test = "scikit-learn digits (stand-in)", 1000, 300, 397
    if QUICK:
        n_train = 600
why = " (system data ignored: BILEVEL_IGNORE_SYSTEM_DATA=1)" if data.system_data_ignored() else ""
print(f"data: {name}{why}; {n_train} noisy training, {n_val} clean validation, {n_test} test")

rng = np.random.default_rng(0)
order = rng.permutation(len(labels))[: n_train + n_val]
X = images[order].reshape(len(order), -1).astype(np.float32)
X_test = test_images[:n_test].reshape(n_test, -1).astype(np.float32)
mean, std = X[:n_train].mean(), X[:n_train].std()
X, X_test = (X - mean) / std, (X_test - mean) / std
y_noisy, corrupted = data.corrupt_labels(labels[order[:n_train]], NOISE, 10, seed=0)

problem = bl.problems.hyper_cleaning(
    X[:n_train],
    y_noisy,
    X[n_train:],
    labels[order[n_train:]],
    num_classes=10,
    c=0.01,
    X_test=X_test,
    y_test=test_labels[:n_test],
    corrupted=corrupted,  # adds the metrics weight_corrupted / weight_clean
)
# shared_x_sample: both x-gradients of g on one minibatch (the paper's App. C); with independent
# ones each sampled weight sees the loss of *other* images as noise and nothing is learned
solver = bl.solvers.make(
    "f2sa", lr_outer=100.0, lr_inner=0.05, batch_size=128, inner_steps=5, shared_x_sample=True
)
res = bl.solve(problem, solver, steps=STEPS, eval_every=STEPS // 10, progress=False)

h = res.history
first, last = h.iloc[0], h.iloc[-1]
plain = bl.problems.train_without_bilevel(problem, steps=300)  # fit on the noisy labels as they are
baseline = jax.jit(problem.metrics)(problem.x0, plain)  # one compiled call
print(
    f"mean weight of corrupted images: {first.weight_corrupted:.3f} -> {last.weight_corrupted:.3f}"
)
print(f"mean weight of clean images: {first.weight_clean:.3f} -> {last.weight_clean:.3f}")
print(f"validation loss: {first.outer_loss:.4f} -> {last.outer_loss:.4f}")
print(
    f"test accuracy: trained on the noisy labels {float(baseline['test_acc']):.3f}, "
    f"hyper-cleaned {last.test_acc:.3f}"
)
weights = 1 / (1 + np.exp(-np.asarray(res.x)))  # sigmoid(x_i)
lowest = corrupted[np.argsort(weights)[: n_train // 10]].mean()
print(f"share of corrupted labels among the 10% lowest weights: {lowest:.2f} (at random: {NOISE})")

# ---- figure -------------------------------------------------------------------------------------
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
ax1.plot(h["step"], h["weight_clean"], label="mean weight, clean labels")
ax1.plot(h["step"], h["weight_corrupted"], label="mean weight, corrupted labels")
ax1.plot(h["step"], h["test_acc"], "--", label="test accuracy")
ax1.set_xlabel("outer step")
ax1.set_title(f"F2SA hyper-cleaning, {name}", fontsize=10)
ax1.legend(fontsize=8)
bins = np.linspace(0, 1, 31)
ax2.hist(weights[~corrupted], bins, alpha=0.6, label="clean")
ax2.hist(weights[corrupted], bins, alpha=0.6, label="corrupted")
ax2.set_xlabel("learned weight sigmoid(x_i)")
ax2.set_ylabel("training images")
ax2.legend()
fig.tight_layout()
fig.savefig(OUT / "hyper_cleaning_fashion_mnist.png", dpi=90)
print(f"figure: {OUT / 'hyper_cleaning_fashion_mnist.png'}")
