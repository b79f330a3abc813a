"""Mutation score of the solvers on a seeded sample of mutants (docs/testing.md).

``mutmut`` (configured in pyproject.toml, ``[tool.mutmut]``) mutates one operator, constant or
argument at a time in ``src/bilevel/solvers``, the sets' LMOs / projections and the online
regret, and runs the tests that reach the mutated function; a mutant no test fails "survived".
Every mutant takes 5-60 s on two cores (a fresh process importing JAX and compiling), so the
whole population (thousands) is a night's run; this script draws a seeded uniform sample, runs
it, and prints the kill rate with its binomial standard error and every survivor's diff.

Usage (from the repository root, after ``pip install mutmut``)::

    python benchmarks/mutation.py --sample 300 --seed 0      # a sample (about an hour)
    python benchmarks/mutation.py --report                    # the table of what has run
    mutmut run                                                # every mutant

Results accumulate in ``mutants/`` (git-ignored): a second call with another seed adds to the
first, and ``--report`` counts every mutant that has run.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import subprocess
import sys

STATUS = re.compile(r"^\s*(\S+): (.+)$")


def mutmut(*args: str, check: bool = True) -> str:
    done = subprocess.run(["mutmut", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"mutmut {' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def statuses() -> dict[str, str]:
    """Every generated mutant's status (``killed``, ``survived``, ``not checked``, ...)."""
    out = mutmut("results", "--all", "true")
    return {m.group(1): m.group(2) for line in out.splitlines() if (m := STATUS.match(line))}


def run_sample(size: int, seed: int) -> None:
    # generate the mutants and the per-test coverage (a pattern matching no mutant runs none)
    mutmut("run", "no-such-mutant-*", check=False)
    pending = sorted(name for name, status in statuses().items() if status == "not checked")
    if not pending:
        sys.exit("no mutants to run (is [tool.mutmut] in pyproject.toml?)")
    chosen = random.Random(seed).sample(pending, min(size, len(pending)))
    print(f"running {len(chosen)} of {len(pending)} unchecked mutants (seed {seed})", flush=True)
    subprocess.run(["mutmut", "run", *chosen], check=False)


def report() -> None:
    status = statuses()
    ran = {name: s for name, s in status.items() if s != "not checked"}
    counts: dict[str, int] = {}
    for s in ran.values():
        counts[s] = counts.get(s, 0) + 1
    print(f"mutants generated: {len(status)}, run: {len(ran)}")
    for s, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {s:>12}: {n}")
    killed = counts.get("killed", 0) + counts.get("timeout", 0)
    if ran:
        rate = killed / len(ran)
        err = math.sqrt(rate * (1 - rate) / len(ran))
        print(f"kill rate (killed or timed out / run): {rate:.3f} +- {err:.3f}")
    for name in sorted(n for n, s in ran.items() if s == "survived"):
        print(f"\n--- survived: {name}")
        diff = mutmut("show", name, check=False)
        print("\n".join(line for line in diff.splitlines() if line[:1] in "+-"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=300, help="mutants to run (default 300)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", action="store_true", help="only print what has run")
    args = parser.parse_args()
    if not args.report:
        run_sample(args.sample, args.seed)
    report()


if __name__ == "__main__":
    main()
