"""The dependency floors are declared once and pinned once, and the two agree.

``[project] dependencies`` in pyproject.toml says the oldest release of each direct dependency
that the package supports; ``.ci/constraints-floors.txt`` pins exactly those releases, so that
``.ci/floors`` can install them and run the suite's smoke subset on them
(docs/dependencies.md). Nothing is installed here: a floor raised in one file and not the
other, or a new dependency without a pin, fails a fast test instead of leaving the floors
unchecked.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / ".ci" / "constraints-floors.txt"
FLOORS_SCRIPT = ROOT / ".ci" / "floors"
DOC = ROOT / "docs" / "dependencies.md"

#: pins that are not direct dependencies but must match one: jaxlib ships with jax, and pip
#: would otherwise pair jax's floor with the newest jaxlib, which that jax refuses at import
COMPANIONS = {"jaxlib": "jax"}

# a PEP 508 requirement reduced to what the floors need: a name, extras, its specifiers
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*([^;]*)")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)$")


def _normalise(name: str) -> str:
    """A distribution name as PEP 503 compares them (``scikit_learn`` is ``scikit-learn``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _floors() -> dict[str, str]:
    """``{name: floor}`` of ``[project] dependencies``; a dependency without ``>=`` fails."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for requirement in deps:
        name, _extras, specifiers = _REQUIREMENT.match(requirement).groups()
        lower = [s.strip()[2:].strip() for s in specifiers.split(",") if s.strip()[:2] == ">="]
        assert len(lower) == 1, f"{requirement!r} needs exactly one '>=' floor"
        floors[_normalise(name)] = lower[0]
    return floors


def _pins() -> dict[str, str]:
    """``{name: version}`` of the constraints file (one ``name==version`` a line)."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        assert match, f"{line!r} in {CONSTRAINTS.name} is not 'name==version'"
        name = _normalise(match.group(1))
        assert name not in pins, f"{name} is pinned twice"
        pins[name] = match.group(2)
    return pins


def test_every_direct_dependency_is_pinned_at_its_floor():
    floors, pins = _floors(), _pins()
    missing = sorted(set(floors) - set(pins))
    assert not missing, f"direct dependencies without a pin in {CONSTRAINTS.name}: {missing}"
    differ = {name: (floor, pins[name]) for name, floor in floors.items() if pins[name] != floor}
    assert not differ, f"pyproject floor != pin: {differ}"


def test_the_constraints_pin_nothing_else_but_companions_at_their_release():
    floors, pins = _floors(), _pins()
    extra = set(pins) - set(floors)
    assert extra <= set(COMPANIONS), f"pins of no direct dependency: {sorted(extra)}"
    for companion, owner in COMPANIONS.items():
        assert pins.get(companion) == floors[owner], (
            f"{companion} must be pinned at {owner}'s floor"
        )


@pytest.mark.parametrize("name", sorted(_floors()))
def test_the_doc_states_each_floor(name):
    """docs/dependencies.md's table row for each dependency names its floor."""
    rows = [line for line in DOC.read_text().splitlines() if line.startswith(f"| {name} |")]
    assert rows, f"no row '| {name} |' in {DOC.name}"
    assert f"| {_floors()[name]} |" in rows[0], f"{DOC.name} gives another floor: {rows[0]}"


def test_the_floors_script_installs_the_constraints():
    script = FLOORS_SCRIPT.read_text()
    assert os.access(FLOORS_SCRIPT, os.X_OK), ".ci/floors is not executable"
    assert "constraints-floors.txt" in script and "pytest" in script
