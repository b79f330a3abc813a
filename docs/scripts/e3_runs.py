"""Run chosen runs of PZOBO E3 (``pzobo-deep-hyperrep``) in their own process.

``bilevel reproduce pzobo-deep-hyperrep`` runs its six runs (four methods, two N-sweep runs) one
after another on one core; this script lets a second core take some of them with the same
problem and settings (``e3_problem``, ``e3_methods``). It writes ``curves/<label>.csv`` in the
same format. Used on 2026-11-22 for the N = 20 sweep run (see docs/reproduction.md).

    python docs/scripts/e3_runs.py "PZOBO-S N=20" --out runs/e3-extra
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bilevel.experiments.common import run_methods
from bilevel.experiments.pzobo_deep_hyperrep import e3_methods, e3_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("labels", nargs="+", help='run labels, e.g. "PZOBO-S N=20"')
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    problem, note, _, _ = e3_problem(args.quick)
    methods, sweep, _ = e3_methods(args.quick)
    by_label = {m.label: m for m in methods + sweep}
    unknown = [label for label in args.labels if label not in by_label]
    if unknown:
        raise SystemExit(f"unknown run label(s) {unknown}; choose from {sorted(by_label)}")
    print(note)
    curves = args.out / "curves"
    curves.mkdir(parents=True, exist_ok=True)
    for label in args.labels:
        t0 = time.perf_counter()
        hist = run_methods(problem, [by_label[label]], seeds=args.seeds)[label]
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
        hist.to_csv(curves / f"{safe}.csv", index=False)
        print(f"{label}: {time.perf_counter() - t0:.0f} s -> {curves / (safe + '.csv')}")


if __name__ == "__main__":
    main()
