"""The registry's table of solvers: every registered name findable by its paper, its class and
its file, and ``docs/solvers.md`` generated from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import bilevel as bl
from bilevel.cli import app
from bilevel.solvers import registry

DOCS = Path(__file__).resolve().parents[1] / "docs" / "solvers.md"
PACKAGE = Path(bl.__file__).resolve().parent
ROWS = registry.table()


def test_the_table_lists_every_registered_name_once():
    assert [row.name for row in ROWS] == bl.solvers.names("all")
    offline = {row.name for row in registry.table("offline")}
    online = {row.name for row in registry.table("online")}
    assert offline == set(bl.solvers.names()) and online == set(bl.solvers.names("online"))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_every_solver_is_exported_and_cites_its_paper(row):
    assert row.cls is bl.solvers.get(row.name)
    assert getattr(bl.solvers, row.cls.__name__) is row.cls
    assert row.cls.__name__ in bl.solvers.__all__
    # authors, title, venue and year: at least a four-digit year and a few words
    assert row.paper.strip() and any(str(year) in row.paper for year in range(1950, 2100))
    assert len(row.paper.split()) >= 6, row.paper


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_every_solver_lives_in_a_file_named_after_it(row):
    path = Path(row.file)
    assert path.name == row.name.replace("-", "_") + ".py"  # aid-cg -> aid_cg.py
    assert path.parts[0] == "solvers" and path.parent.name == row.family
    assert (PACKAGE / path).is_file()
    assert row.cls.__module__ == "bilevel." + ".".join(path.with_suffix("").parts)


def test_docs_page_is_up_to_date():
    assert DOCS.read_text() == registry.markdown(), (
        "docs/solvers.md is stale: regenerate it with "
        "`python -m bilevel.solvers --markdown > docs/solvers.md`"
    )


def test_cli_long_prints_the_table():
    result = CliRunner().invoke(app, ["solvers", "--long"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(ROWS)
    for line, row in zip(lines, ROWS, strict=True):
        assert line.split()[:4] == [row.name, row.cls.__name__, row.family, row.file]
        assert line.endswith(row.paper)
