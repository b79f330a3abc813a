"""benchmarks/rates.py's report writer: an ``--only`` run keeps the other rows and the notes
written below the table (it used to drop the notes)."""

import importlib.util
import sys
import types
from pathlib import Path

_PATH = Path(__file__).parents[1] / "benchmarks" / "rates.py"
_SPEC = importlib.util.spec_from_file_location("rates_benchmark", _PATH)
rates = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = rates  # its dataclasses look their module up there
_SPEC.loader.exec_module(rates)

OLD = """# Measured convergence rates vs theory

| case | measure | measured slope | theory | consistent | points | status | seconds |
|---|---|---|---|---|---|---|---|
| F2SA, noise: both | E grad_norm^2 | -0.526 | -2/7 | yes | 57 | ok | 98 |

STABLE, nonconvex protocol (old numbers).

A note written by hand,
over two lines.

## Reading the numbers

The analysis.
"""


def test_only_keeps_the_notes_and_replaces_the_stable_line(tmp_path):
    out = tmp_path / "rates.md"
    out.write_text(OLD)
    args = types.SimpleNamespace(seeds=10, steps=20000, batch=32, only=["stable"], out=out)
    rates.write_report(args, [], ([100, 400], [0.5, 0.25], -0.5))
    text = out.read_text()
    assert "| F2SA, noise: both |" in text  # the other case's row is kept
    assert "A note written by hand,\nover two lines." in text
    assert "(old numbers)" not in text and "K = 100: 0.5, K = 400: 0.25" in text
    assert text.endswith("## Reading the numbers\n\nThe analysis.\n")


def test_a_full_run_starts_the_notes_afresh(tmp_path):
    out = tmp_path / "rates.md"
    out.write_text(OLD)
    args = types.SimpleNamespace(seeds=10, steps=20000, batch=32, only=None, out=out)
    rates.write_report(args, [], None)
    text = out.read_text()
    assert "A note written by hand" not in text and "The analysis." in text
