"""The history of a run: one row per (seed, evaluation), with exact counter totals.

The solver's counters are int32 in its state (they may wrap in long runs); the history adds
their deltas modulo 2^32 into Python ints per seed, so ``samples`` and the oracle-call columns
are exact however long the run. :class:`History` is what :class:`bilevel.drivers.engine.Engine`
records into; ``bl.sweep`` keeps one per grid point behind the same interface.

It also applies the divergence rules (:mod:`bilevel.drivers.divergence`) at each evaluation,
because the rules compare with a seed's start and the history is what remembers the start: the
first row per seed (the headline metric) and the first evaluation's iterate norms. It keeps why
each seed diverged (``reasons``) for the run's message.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bilevel.core.oracles import Counts
from bilevel.drivers.divergence import (
    HEADLINE_EXPLODED,
    ITERATES_GREW,
    NON_FINITE,
    Health,
    exploded,
    grown,
)

__all__ = ["History", "with_counts_raised"]


class History:
    """History rows and per-seed Python-int counter totals.

    Attributes:
        seeds: the seeds, in the order of the state's seed axis.
        rows: the rows so far (dicts; ``pandas.DataFrame(rows)`` is ``Result.history``).
        totals: per seed, the counter totals and the last raw (unsigned) counter values.
        alive: per seed, whether it has not diverged (updated in place by the engine).
        start_norms: ``(seeds, 2)``, ``(||x||, ||y||)`` at the first evaluation that reported
            norms (the start), ``None`` before it.
        reasons: per seed, why it diverged (one of ``divergence.REASONS``), ``None`` if not.
    """

    def __init__(self, seeds: list[int], offset: dict[str, int] | None = None):
        self.seeds = seeds
        self.rows: list[dict] = []
        # ``offset``: counts spent before the run (a tuning run), included in every row
        start = {k: int((offset or {}).get(k, 0)) for k in Counts._fields}
        self.totals = [dict(start) | {"raw": {}} for _ in seeds]
        self.alive = np.ones(len(seeds), bool)
        self.start_norms: np.ndarray | None = None
        self.reasons: list[str | None] = [None] * len(seeds)

    def restore(self, meta: dict, rows: list[dict]) -> None:
        """Take up the rows, totals, alive seeds, start norms and reasons a checkpoint saved
        (:meth:`meta`). A checkpoint from before the norms were saved has none: the first
        evaluation after the resume then counts as the start."""
        self.rows = rows
        self.totals = [dict(t) for t in meta["totals"]]
        self.alive = np.array(meta["alive"], bool)
        norms = meta.get("start_norms")
        self.start_norms = None if norms is None else np.array(norms, float)
        self.reasons = list(meta.get("reasons", [None] * len(self.seeds)))

    def meta(self) -> dict:
        """What a checkpoint saves besides the rows (JSON-able)."""
        norms = None if self.start_norms is None else self.start_norms.tolist()
        return {
            "totals": self.totals,
            "alive": self.alive.tolist(),
            "start_norms": norms,
            "reasons": self.reasons,
        }

    def record(self, metrics: dict, counts: Counts, finite, step: int, seconds: float):
        """Add the rows of one evaluation; returns which seeds are still sound: finite, headline
        metric not exploded, iterates not grown (:mod:`bilevel.drivers.divergence`).

        ``finite`` is the evaluation's :class:`~bilevel.drivers.divergence.Health`
        (:func:`bilevel.drivers.programs.evaluate`) or a plain finiteness array per seed (then
        the iterate rule is not applied).
        """
        finite = self._judge(finite, metrics, step)
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

    def _judge(self, health, metrics: dict, step: int) -> np.ndarray:
        """Which seeds pass every rule; the first rule a live seed fails is its reason."""
        if not isinstance(health, Health):
            health = Health(health, None)
        n = len(self.seeds)
        finite = np.broadcast_to(np.atleast_1d(np.asarray(health.finite, bool)), (n,))
        checks = [
            (~finite, NON_FINITE),
            (exploded(metrics, step, self.seeds, self.rows), HEADLINE_EXPLODED),
            (self._grown(health.norms), ITERATES_GREW),
        ]
        bad = np.zeros(n, bool)
        for hit, reason in checks:
            for i in np.flatnonzero(hit & ~bad & self.alive):
                self.reasons[i] = reason
            bad |= hit
        return ~bad

    def _grown(self, norms) -> np.ndarray:
        """The iterate rule; the first norms it sees are the start."""
        if norms is None:
            return np.zeros(len(self.seeds), bool)
        norms = np.asarray(norms, float).reshape(len(self.seeds), -1)
        if self.start_norms is None:
            self.start_norms = norms.copy()
        return grown(norms, self.start_norms)

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


def with_counts_raised(frame: pd.DataFrame, extra: dict[str, int]) -> pd.DataFrame:
    """A copy of a history ``frame`` whose counter columns include ``extra`` more (one count
    per :class:`bilevel.core.oracles.Counts` field, spent outside the run: the tuned solve's
    later runs when an earlier one is returned), ``samples`` and ``oracle_calls`` with them."""
    frame = frame.copy()
    for name, value in extra.items():
        frame[name] = frame[name] + value
    calls = sum(v for k, v in extra.items() if not k.startswith("samples"))
    frame["samples"] = frame["samples"] + extra["samples_outer"] + extra["samples_inner"]
    frame["oracle_calls"] = frame["oracle_calls"] + calls
    return frame
