"""Few-shot classification: meta-learn a CNN backbone with PZOBO's Hessian-free meta-gradient.

Task: 4-way 5-shot image classification on classes never seen in training. A convolutional
backbone phi (the outer variable) is shared by all tasks; each task i fits its own linear head
w_i (the inner variable) on its 5 support images per class, under a ridge that makes that fit
strongly convex; phi is trained so that the fitted heads classify the tasks' query images well
(PZOBO, eq. 9):

    min_phi  mean_i L_query_i(phi, w_i*(phi))
    s.t.     w_i*(phi) = argmin_w  L_support_i(phi, w) + reg/2 ||w||^2

Method: PZOBO (Sow, Ji, Liang, "On the Convergence Theory for Hessian-Free Bilevel Algorithms",
NeurIPS 2022, App. B.4): the meta-gradient through w_i*(phi) is estimated by a zeroth-order
difference along a random direction of the backbone's weights (one extra head fit on a
perturbed backbone), no second derivatives and no unrolling. `bl.meta` holds the episode
sampler, the CNN4 backbone (equinox), the learners (`bl.meta.make("pzobo")`, or "maml",
"fomaml", "anil", "protonet" to compare) and the timed training loop `bl.meta.meta_train`.

Data: Fashion-MNIST split by classes (6 meta-train, 4 meta-test) when it is installed, else
scikit-learn's digits (`bilevel.meta.datasets.few_shot_data` says which, in `data.note`);
`BILEVEL_IGNORE_SYSTEM_DATA=1` ignores a system-wide copy to show the stand-in path.

Run it: `python examples/few_shot_pzobo_meta.py` (writes `few_shot_pzobo_meta.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` runs 3
meta-steps instead of 40 on meta-batches of 2 tasks instead of 8, 5 inner steps instead of 15,
a backbone of 8 filters instead of 16, and evaluates on 8 meta-test tasks instead of 100, before
and after training only (instead of every 10 steps).
"""

import os
import pathlib

import jax
import matplotlib

import bilevel as bl
from bilevel.data import system_data_ignored
from bilevel.meta.backbones import CNN4
from bilevel.meta.datasets import few_shot_data

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
STEPS, META_BATCH, INNER, HIDDEN, TASKS = (3, 2, 5, 8, 8) if QUICK else (40, 8, 15, 16, 100)
EVAL_EVERY = STEPS if QUICK else 10
if QUICK:
    print(
        f"quick mode: {STEPS} meta-steps instead of 40, meta-batch {META_BATCH} instead of 8, "
        f"{INNER} inner steps instead of 15, {HIDDEN} filters instead of 16, {TASKS} meta-test "
        "tasks instead of 100, evaluated before and after training only"
    )

data = few_shot_data(log=lambda line: None)  # miniImageNet, else Fashion-MNIST, else digits
stand_in = "" if data.name == "miniImageNet" else " (a stand-in for the paper's miniImageNet)"
ignored = "; system data ignored: BILEVEL_IGNORE_SYSTEM_DATA=1" if system_data_ignored() else ""
print(f"data: {data.name}{stand_in}{ignored}; {data.ways}-way 5-shot tasks")
train = bl.meta.EpisodeSampler(data.train, data.ways, shots=5, queries=5, meta_batch=META_BATCH)
test = bl.meta.EpisodeSampler(data.test, data.ways, shots=5, queries=5, meta_batch=META_BATCH)
image_size = data.train.images.shape[-1]
backbone = CNN4(data.train.images.shape[1], image_size, hidden=HIDDEN, key=jax.random.key(0))
learner = bl.meta.make("pzobo", inner_steps=INNER, lr_inner=0.1, lr_outer=0.003)
trace = bl.meta.meta_train(
    learner,
    backbone,
    train_sampler=train,
    test_sampler=test,
    ways=data.ways,
    steps=STEPS,
    eval_every=EVAL_EVERY,
    eval_tasks=TASKS,
    key=jax.random.key(1),
    log=None,
)
h = trace.history
first, last = h.iloc[0], h.iloc[-1]
print(
    f"meta-test accuracy on unseen classes: {first.test_accuracy:.3f} -> "
    f"{last.test_accuracy:.3f} (+- {last.test_ci95:.3f}, {TASKS} tasks; chance "
    f"{1 / data.ways:.3f})"
)
print(
    f"meta-training query loss: {first.train_loss:.4f} (at the start) -> "
    f"{last.train_loss:.4f} (mean over the last {EVAL_EVERY} steps)"
)
print(
    f"training time {last.seconds:.1f} s ({last.seconds / STEPS:.2f} s per meta-step), "
    f"compilation {trace.compile_seconds:.1f} s"
)

# ---- figure -------------------------------------------------------------------------------------
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
ax1.errorbar(h["step"], h["test_accuracy"], yerr=h["test_ci95"], marker="o", capsize=3)
ax1.axhline(1 / data.ways, color="gray", ls=":", label="chance")
ax1.set_xlabel("meta-step")
ax1.set_ylabel("meta-test accuracy (unseen classes)")
ax1.legend()
ax1.set_title(f"PZOBO, CNN4 on {data.name}", fontsize=10)
ax2.plot(h["step"], h["train_loss"], marker="o")
ax2.set_xlabel("meta-step")
ax2.set_ylabel(f"query loss, mean of {EVAL_EVERY} meta-batches")
fig.tight_layout()
fig.savefig(OUT / "few_shot_pzobo_meta.png", dpi=90)
print(f"figure: {OUT / 'few_shot_pzobo_meta.png'}")
