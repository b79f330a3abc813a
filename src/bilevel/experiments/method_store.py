"""Finished methods of a long reproduction, kept on disk so that a rerun resumes.

A full reproduction plays several methods one after another; some take an hour. When the run
is interrupted (Ctrl-C, a time limit, a lost machine), the methods already finished should not
be played again. :class:`MethodStore` keeps each finished method's curve in
``OUT/methods/LABEL.csv`` with a line in ``OUT/methods/index.json`` that records the key it was
computed under (the experiment's setting, the method's hyperparameters, the package version),
the device and the seconds it took. A rerun with the same key loads the curve instead of
playing the method again; any change of setting, hyperparameter or version plays it anew.
Edits to the code between two runs are not part of the key: delete ``methods/`` after one.

The same mechanism lets a run be split across machines: the methods played elsewhere (on an
accelerator, say) are copied into ``methods/`` and the rest are played here. The outputs say
which methods were loaded and where they were computed (:meth:`MethodStore.notes`).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
from pathlib import Path

import jax
import pandas as pd

from bilevel.drivers.writes import write_each
from bilevel.experiments.common import file_stem

__all__ = ["MethodStore"]


def _write_whole(path: Path, write) -> None:
    """Write ``path`` whole or leave it as it was (``write_each``); a failure raises its
    ``WriteError`` (naming the file), so no index line is written for a curve not saved."""
    for failure in write_each([(path, write)]):
        raise failure


def _device() -> str:
    dev = jax.devices()[0]
    return (
        dev.platform if dev.device_kind == dev.platform else f"{dev.platform} ({dev.device_kind})"
    )


@dataclasses.dataclass
class MethodStore:
    """Per-method curves of one experiment's run under ``directory`` (``OUT/methods``).

    Args:
        directory: where the curves and ``index.json`` live.
        setting: what every method of the run shares (data, sizes, seeds, dtype): part of
            each method's key. Leave out what does not change a method's curve (the list of
            methods played, say), or a run of a subset would never be reused.
    """

    directory: Path
    setting: dict
    loaded: dict[str, dict] = dataclasses.field(default_factory=dict)

    def key(self, label: str, hyper: dict) -> str:
        from bilevel import __version__

        blob = json.dumps(
            {"setting": self.setting, "label": label, "hyper": hyper, "version": __version__},
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _index(self) -> dict:
        path = self.directory / "index.json"
        if not path.exists():
            return {}
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):  # unreadable: play everything anew, it is rewritten
            return {}

    def _csv(self, label: str) -> Path:
        return self.directory / f"{file_stem(label)}.csv"

    def load(self, label: str, hyper: dict) -> pd.DataFrame | None:
        """The stored curve of ``label`` if it was computed under the same key, else None."""
        entry = self._index().get(label)
        path = self._csv(label)
        if entry is None or entry.get("key") != self.key(label, hyper) or not path.exists():
            return None
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError):
            return None
        self.loaded[label] = entry
        return frame

    def save(self, label: str, hyper: dict, frame: pd.DataFrame, seconds: float) -> None:
        """Keep ``label``'s finished curve (the CSV first, then its index line)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        _write_whole(self._csv(label), lambda p: frame.to_csv(p, index=False))
        index = self._index()
        index[label] = {
            "key": self.key(label, hyper),
            "device": _device(),
            "seconds": round(seconds, 1),
            "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        text = json.dumps(index, indent=1, sort_keys=True)
        _write_whole(self.directory / "index.json", lambda p: p.write_text(text))

    def notes(self) -> list[str]:
        """One line for the outputs naming the methods loaded rather than played, if any."""
        if not self.loaded:
            return []
        parts = [
            f"{label} ({e['device']}, {e['seconds']:.0f} s, finished {e['finished']})"
            for label, e in self.loaded.items()
        ]
        return [
            "Resumed: these methods were loaded from methods/ (computed earlier under the same "
            "setting, hyperparameters and package version) rather than played in this run: "
            + "; ".join(parts)
            + "."
        ]
