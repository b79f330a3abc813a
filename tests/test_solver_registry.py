"""The registry's table of solvers: every registered name findable by its paper, its class and
its file, and ``docs/solvers.md`` generated from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
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


def test_every_solver_declares_the_oracles_it_calls():
    """``registry.ORACLES`` (the solver index's "needs" column) has one entry per registered
    name, each a set of ``Counts`` fields."""
    assert set(registry.ORACLES) == set(bl.solvers.names("all"))
    kinds = set(bl.oracles.Counts._fields) - {"samples_outer", "samples_inner"}
    for name, declared in registry.ORACLES.items():
        assert declared and declared <= kinds, name
    assert all(row.oracles == registry.ORACLES[row.name] for row in ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_the_declared_oracles_are_those_one_step_calls(row):
    """One step (an online solver: one round) with the default settings, on a small closed-form
    problem, calls exactly the oracle kinds ``registry.ORACLES`` declares. Step sizes left
    ``"auto"`` get numbers (a tuning run would cost more than the step, and does not change
    which oracles a step calls)."""
    cls = row.cls
    if cls.online:
        problem = bl.problems.drifting_quadratic(dx=2, dy=2, horizon=4)
    else:
        problem = bl.problems.quadratic(dx=2, dy=2)
        if cls.needs_bounded_set:
            problem = problem.replace(x_set=bl.sets.L2Ball(10.0))
    fields = registry.defaults(cls)
    steps = {k: 0.01 for k, v in fields.items() if k.startswith("lr_") and v == "auto"}
    if cls.needs_bounded_set:  # the Frank-Wolfe methods keep their papers' "auto" rules
        steps = {}
    solver = bl.solvers.make(row.name, **steps).with_horizon(4).resolve(problem)
    state = solver.init(problem, jax.random.PRNGKey(0))
    after = jax.jit(solver.step)(problem, state)
    called = {
        kind
        for kind in after.counts._fields
        if not kind.startswith("samples")
        and int(getattr(after.counts, kind)) > int(getattr(state.counts, kind))
    }
    assert called == set(registry.ORACLES[row.name]), (
        f"{row.name}: one step calls {sorted(called)}; registry.ORACLES declares "
        f"{sorted(registry.ORACLES[row.name])}"
    )


def test_the_index_lists_every_default():
    """Every hyperparameter whose default differs from the common ones is in its row."""
    page = DOCS.read_text()
    for row in ROWS:
        line = next(x for x in page.splitlines() if x.startswith(f"| `{row.name}` |"))
        for field in dataclasses.fields(row.cls):
            if field.init and field.name not in registry.COMMON_DEFAULTS:
                assert f"`{field.name}=" in line, (row.name, field.name)


def test_cli_long_prints_the_table():
    result = CliRunner().invoke(app, ["solvers", "--long"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(ROWS)
    for line, row in zip(lines, ROWS, strict=True):
        assert line.split()[:4] == [row.name, row.cls.__name__, row.family, row.file]
        assert line.endswith(row.paper)
