"""benchmarks/rates.py's report writer: an ``--only`` run keeps the other rows and the notes
written below the table (it used to drop the notes), and replaces the notes of the rates
measured across horizons (STABLE's nonconvex protocol, IBCG's two rules) that it reran."""

import dataclasses
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


def measured(spec, values, lengths=(100, 400)):
    return dataclasses.replace(spec, lengths=list(lengths), values=list(values))


def test_only_keeps_the_notes_and_replaces_the_stable_line(tmp_path):
    out = tmp_path / "rates.md"
    out.write_text(OLD)
    args = types.SimpleNamespace(seeds=10, steps=20000, batch=32, only=["stable"], out=out)
    rates.write_report(args, [], [measured(rates.STABLE_NONCONVEX, [0.5, 0.25])])
    text = out.read_text()
    assert "| F2SA, noise: both |" in text  # the other case's row is kept
    assert "A note written by hand,\nover two lines." in text
    assert "(old numbers)" not in text and "K = 100: 0.5, K = 400: 0.25" in text
    assert text.endswith("## Reading the numbers\n\nThe analysis.\n")


def test_a_full_run_starts_the_notes_afresh(tmp_path):
    out = tmp_path / "rates.md"
    out.write_text(OLD)
    args = types.SimpleNamespace(seeds=10, steps=20000, batch=32, only=None, out=out)
    rates.write_report(args, [], [])
    text = out.read_text()
    assert "A note written by hand" not in text and "The analysis." in text


def test_the_stable_note_keeps_its_format():
    """The line rates.py wrote before the horizon protocol was shared with IBCG."""
    note = measured(rates.STABLE_NONCONVEX, [0.5, 0.25]).note()
    assert note == (
        "STABLE, nonconvex protocol (Theorem 2: constant steps 0.5/sqrt(K), average of "
        "||grad F(x_k)||^2 over the run): K = 100: 0.5, K = 400: 0.25; slope in K -0.500 "
        "(theory -1/2)."
    )


def test_only_ibcg_keeps_the_stable_line_and_replaces_its_own(tmp_path):
    """``--only ibcg`` twice: the first adds both IBCG notes after the STABLE line, the second
    replaces them in place; the STABLE line and the hand-written note stay."""
    out = tmp_path / "rates.md"
    out.write_text(OLD)
    args = types.SimpleNamespace(seeds=10, steps=20000, batch=32, only=["ibcg"], out=out)
    for values in ([0.1, 0.025], [0.2, 0.05]):
        ibcg = [measured(rates.IBCG_CONVEX, values), measured(rates.IBCG_NONCONVEX, values)]
        rates.write_report(args, [], ibcg)
    text = out.read_text()
    assert text.count("IBCG, convex rule (") == 1 and text.count("IBCG, nonconvex rule (") == 1
    assert "K = 100: 0.1," not in text and "K = 100: 0.2, K = 400: 0.05" in text
    order = ["STABLE, nonconvex protocol (old", "IBCG, convex", "IBCG, nonconvex", "A note"]
    positions = [text.index(label) for label in order]
    assert positions == sorted(positions)
    assert text.endswith("## Reading the numbers\n\nThe analysis.\n")
