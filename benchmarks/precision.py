"""Precision: how far solvers get in float32 against float64, and bfloat16 for the networks.

1. The quadratic (dx 10, dy 50, cond 10; exact ||grad F||), deterministic and stochastic
   (batch 64), 3000 steps: the final and smallest ||grad F(x_k)|| (every 100 steps) of each
   solver in float32 (JAX's default) and in float64 (``jax_enable_x64``, the switch the exact
   tests use), each dtype in its own subprocess.
2. Data hyper-cleaning on Fashion-MNIST (19,000 noisy / 1,000 clean / 1,000 test) with the MLP
   (one hidden layer of 256) and the LeNet-5 CNN, F2SA batch 64: time per step of the default
   (float32) problem against ``compute_dtype="bfloat16"`` (compiled chunks timed alternately,
   median ratio, ``timing.paired_times``) and the validation loss / accuracy after the same
   steps from the same seed. Without the Fashion-MNIST files this part says so and is skipped.

Nothing passes or fails. Run: ``python benchmarks/precision.py [--part quadratic|bfloat16]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings

QUADRATIC_RUNS = {  # name: (solver, settings); lr_inner "auto" = 1/L_g
    "aid-cg": ("aid-cg", {"lr_outer": 0.1, "inner_steps": 30, "linsolve_steps": 50}),
    "f2sa": ("f2sa", {"lr_outer": 0.1}),
    "stocbio": ("stocbio", {"lr_outer": 0.1}),
}
QUADRATIC_STEPS = 3000


def quadratic_floors(x64: bool) -> dict:
    """In this process: {problem/solver: (final, min) ||grad F||} in the dtype x64 selects."""
    import jax

    jax.config.update("jax_enable_x64", x64)
    import bilevel as bl

    out = {}
    for stochastic in (False, True):
        problem = bl.problems.quadratic(10, 50, stochastic=stochastic)
        for label, (name, settings) in QUADRATIC_RUNS.items():
            settings = dict(settings, batch_size=64) if stochastic else settings
            solver = bl.solvers.make(name, **settings)
            res = bl.solve(problem, solver, QUADRATIC_STEPS, eval_every=100, progress=False)
            g = res.history["grad_norm"].to_numpy()
            key = f"{'stochastic' if stochastic else 'deterministic'} {label}"
            out[key] = (float(g[-1]), float(g.min()))
    return out


def quadratic_part() -> None:
    floors = {}
    for bits in (32, 64):
        cmd = [sys.executable, __file__, "--child-quadratic", str(bits)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        floors[bits] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"quadratic, ||grad F(x_K)|| after {QUADRATIC_STEPS} steps (min over the run)")
    print(f"{'problem / solver':28s} {'float32':>22s} {'float64':>22s}")
    for key in floors[32]:
        cells = [f"{floors[b][key][0]:.2e} ({floors[b][key][1]:.2e})" for b in (32, 64)]
        print(f"{key:28s} {cells[0]:>22s} {cells[1]:>22s}")


def bfloat16_part(steps_mlp: int, steps_cnn: int, repeats: int) -> None:
    import jax
    from timing import paired_times, solver_chunk

    import bilevel as bl
    from bilevel import data as bl_data

    try:
        bl_data.load_fashion_mnist("test")
    except bl_data.DatasetNotFoundError as err:
        print(f"bfloat16 part skipped: Fashion-MNIST not found ({err}).")
        return
    print(f"\nhyper-cleaning, Fashion-MNIST 19,000 / 1,000, F2SA batch 64; devices {jax.devices()}")
    print(
        f"{'model':8s} {'steps':>5s} {'f32 ms/step':>11s} {'bf16 ms/step':>12s} {'bf16/f32':>8s} "
        f"{'val loss f32':>12s} {'bf16':>6s} {'val acc f32':>11s} {'bf16':>6s}"
    )
    for model, options, steps in (
        ("mlp256", {"model": "mlp", "hidden": 256}, steps_mlp),
        ("cnn", {"model": "cnn"}, steps_cnn),
    ):
        solver = bl.solvers.make("f2sa", lr_outer=0.5, lr_inner=0.05, batch_size=64)
        problems = [
            bl.problems.hyper_cleaning_dataset(n_test=1000, compute_dtype=dt, **options)
            for dt in (None, "bfloat16")
        ]
        thunks = [solver_chunk(p, solver, 10, 1)[0] for p in problems]
        t32, t16, ratio = paired_times(thunks[0], thunks[1], repeats)
        finals = []
        for p in problems:
            with warnings.catch_warnings():  # the networks are not convex in y; run anyway
                warnings.simplefilter("ignore", bl.NotStronglyConvexWarning)
                res = bl.solve(p, solver, steps, eval_every=steps, progress=False)
            finals.append(res.history.iloc[-1])
        print(
            f"{model:8s} {steps:5d} {t32 / 10 * 1e3:11.1f} {t16 / 10 * 1e3:12.1f} "
            f"{1 / ratio:8.2f} {finals[0]['val_loss']:12.4f} {finals[1]['val_loss']:6.4f} "
            f"{finals[0]['val_acc']:11.3f} {finals[1]['val_acc']:6.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("quadratic", "bfloat16", "both"), default="both")
    parser.add_argument("--steps-mlp", type=int, default=300)
    parser.add_argument("--steps-cnn", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--child-quadratic", type=int, choices=(32, 64), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_quadratic:
        print(json.dumps(quadratic_floors(args.child_quadratic == 64)))
        return
    if args.part in ("quadratic", "both"):
        quadratic_part()
    if args.part in ("bfloat16", "both"):
        bfloat16_part(args.steps_mlp, args.steps_cnn, args.repeats)


if __name__ == "__main__":
    main()
