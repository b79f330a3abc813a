"""The history of a run: one row per (seed, evaluation), with exact counter totals.

The solver's counters are int32 in its state (they may wrap in long runs); the history adds
their deltas modulo 2^32 into Python ints per seed, so ``samples`` and the oracle-call columns
are exact however long the run. :class:`History` is what :class:`bilevel.drivers.engine.Engine`
records into; ``bl.sweep`` keeps one per grid point behind the same interface.
"""

from __future__ import annotations

import numpy as np

from bilevel.core.oracles import Counts
from bilevel.drivers.divergence import exploded

__all__ = ["History"]


class History:
    """History rows and per-seed Python-int counter totals.

    Attributes:
        seeds: the seeds, in the order of the state's seed axis.
        rows: the rows so far (dicts; ``pandas.DataFrame(rows)`` is ``Result.history``).
        totals: per seed, the counter totals and the last raw (unsigned) counter values.
        alive: per seed, whether it has not diverged (updated in place by the engine).
    """

    def __init__(self, seeds: list[int]):
        self.seeds = seeds
        self.rows: list[dict] = []
        self.totals = [{k: 0 for k in Counts._fields} | {"raw": {}} for _ in seeds]
        self.alive = np.ones(len(seeds), bool)

    def restore(self, meta: dict, rows: list[dict]) -> None:
        """Take up the rows, totals and alive seeds a checkpoint saved (:meth:`meta`)."""
        self.rows = rows
        self.totals = [dict(t) for t in meta["totals"]]
        self.alive = np.array(meta["alive"], bool)

    def meta(self) -> dict:
        """What a checkpoint saves besides the rows (JSON-able)."""
        return {"totals": self.totals, "alive": self.alive.tolist()}

    def record(self, metrics: dict, counts: Counts, finite, step: int, seconds: float):
        """Add the rows of one evaluation; returns which seeds are finite (and not exploded)."""
        finite = np.atleast_1d(np.asarray(finite)) & ~exploded(metrics, step, self.seeds, self.rows)
        # the int32 counters as unsigned values, converted once for all seeds
        raw = {
            k: np.atleast_1d(np.asarray(v)).astype(np.int64) & 0xFFFFFFFF
            for k, v in counts._asdict().items()
        }
        new_rows = []
        for i, seed in enumerate(self.seeds):
            totals = self._add_counts(i, raw)
            if self.alive[i] and finite[i]:
                new_rows.append(self._row(seed, step, seconds, totals, metrics, i))
        self.rows.extend(new_rows)
        return finite

    def _add_counts(self, i: int, raw: dict[str, np.ndarray]) -> dict:
        t = self.totals[i]
        for k, v in raw.items():  # add deltas mod 2^32
            now = int(v[i] if v.size > 1 else v[0])
            t[k] += (now - t["raw"].get(k, 0)) % (1 << 32)
            t["raw"][k] = now
        return t

    @staticmethod
    def _row(seed, step, seconds, t, metrics, i) -> dict:
        calls = {k: t[k] for k in Counts._fields if not k.startswith("samples")}
        row = {
            "seed": seed,
            "step": step,
            "samples": t["samples_outer"] + t["samples_inner"],
            "samples_outer": t["samples_outer"],
            "samples_inner": t["samples_inner"],
            "oracle_calls": sum(calls.values()),
            **calls,
            "seconds": seconds,
        }
        for name, v in metrics.items():
            v = np.atleast_1d(np.asarray(v))
            row[name] = float(v[i] if v.size > 1 else v[0])
        return row
