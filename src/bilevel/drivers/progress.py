"""What ``solve`` shows while it runs: a progress bar on a terminal, one line per evaluation
otherwise (a log file, CI, a notebook's captured stderr).

Both show the step count, the rate, the elapsed time and an ETA; the bar adds the headline
metric when the terminal is wide enough (>= 100 columns) and never needs more than 80 columns
without it. The rate and ETA are measured from the end of the first chunk, so the first
compilation does not make the estimate wrong for the rest of the run.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["Progress", "format_duration", "format_rate"]

#: the headline metric, first present wins: shown beside the step count, and the one
#: ``solve`` watches for a blow-up (``bilevel.drivers.divergence.exploded``)
HEADLINE = ("grad_norm", "outer_loss")
#: the bar shows the headline metric only from this width on
WIDE = 100


def format_duration(seconds: float | None) -> str:
    """``h:mm:ss``; ``--:--`` when unknown."""
    if seconds is None or not seconds >= 0 or seconds == float("inf"):
        return "--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_rate(steps_per_second: float | None, unit: str = "step") -> str:
    """``12.3k steps/s`` (or ``0.45 steps/s``); ``-- steps/s`` when unknown. ``unit`` names
    what is counted (``"round"`` for ``bl.solve_online``)."""
    r = steps_per_second
    if r is None or not r > 0:
        return f"-- {unit}s/s"
    for scale, suffix in ((1e6, "M"), (1e3, "k")):
        if r >= scale:
            return f"{r / scale:.1f}{suffix} {unit}s/s"
    return f"{r:.3g} {unit}s/s"


class _Clock:
    """Rate and ETA from wall time, measured from the first update after the start."""

    def __init__(self, steps: int):
        self.steps = steps
        self.t0 = time.monotonic()
        self.first: tuple[float, int] | None = None  # (time, step) at the first chunk's end

    def tick(self, done: int) -> tuple[float, float | None, float | None]:
        """``(elapsed, rate, eta)`` after ``done`` steps."""
        now = time.monotonic()
        if self.first is None:
            self.first = (now, done)
            return now - self.t0, None, None
        t1, d1 = self.first
        if done <= d1 or now <= t1:
            return now - self.t0, None, None
        rate = (done - d1) / (now - t1)
        return now - self.t0, rate, (self.steps - done) / rate


def _headline(rows: list[dict]) -> str:
    """``samples`` and the headline metric of the last evaluation, averaged over seeds."""
    if not rows:
        return ""
    step = rows[-1]["step"]
    last = [r for r in rows[::-1] if r["step"] == step]  # one row per surviving seed
    text = f"samples {last[0]['samples']:,}"
    for name in HEADLINE:
        values = [r[name] for r in last if name in r]
        if values:
            return f"{text}  {name} {sum(values) / len(values):.3e}"
    return text


class Progress:
    """The progress display of one ``solve`` (a no-op when ``enabled`` is false).

    Args:
        enabled: show anything at all.
        steps: the run's total steps.
        solver_name, problem_name: the header line says what runs; the bar shows only the
            (short) solver name so that it fits.
        n_seeds: number of seeds (header line).
        console: a ``rich.console.Console`` (default: stderr); whether it is a terminal picks
            the bar or the line-per-evaluation form.
        unit: what ``steps`` counts, in the singular (``"round"`` for ``bl.solve_online``).
    """

    def __init__(
        self,
        enabled: bool,
        steps: int,
        solver_name: str,
        problem_name: str,
        n_seeds: int = 1,
        console: Any = None,
        unit: str = "step",
    ):
        self.enabled = enabled
        self.unit = unit
        self.bar = None
        if not enabled:
            return
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.steps = steps
        self.name = solver_name[:12]
        self.clock = _Clock(steps)
        seeds = f"{n_seeds} seeds" if n_seeds != 1 else "1 seed"
        self.note(f"{solver_name} on {problem_name}: {steps:,} {unit}s, {seeds}")
        if self.console.is_terminal:
            self._start_bar()

    def _start_bar(self) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        width = self.console.width
        mofn = 2 * len(f"{self.steps:,}") + 1
        # name, M/N, rate, "elapsed eta" and the spaces between the columns
        fixed = 12 + mofn + 14 + 21 + 5
        wide = width >= WIDE
        if wide:
            fixed += 40
        columns = [
            TextColumn(f"[bold]{self.name}[/]"),
            BarColumn(bar_width=max(8, width - fixed - 1)),
            TextColumn("{task.fields[mofn]}"),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[times]}"),
        ]
        if wide:
            columns.append(TextColumn("{task.fields[info]}"))
        self.bar = Progress(*columns, console=self.console, expand=False)
        self.task = self.bar.add_task("solve", total=self.steps, **self._fields(0, []))
        self.bar.start()

    def _fields(self, done: int, rows: list[dict]) -> dict[str, str]:
        elapsed, rate, eta = self.clock.tick(done) if done else (0.0, None, None)
        return {
            "mofn": f"{done:,}/{self.steps:,}",
            "rate": format_rate(rate, self.unit),
            "times": f"{format_duration(elapsed)} eta {format_duration(eta)}",
            "info": _headline(rows),
        }

    def note(self, text: str) -> None:
        """A line of its own (above the bar on a terminal)."""
        if self.enabled:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def update(self, done: int, rows: list[dict]) -> None:
        """After an evaluation at step ``done``; ``rows`` is the history so far."""
        if not self.enabled:
            return
        fields = self._fields(done, rows)
        if self.bar is not None:
            self.bar.update(self.task, completed=done, **fields)
            return
        pct = 100.0 * done / self.steps
        self.note(
            f"{self.name}  {self.unit} {fields['mofn']} ({pct:.1f}%)  {fields['rate']}  "
            f"{fields['times']}  {fields['info']}".rstrip()
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
