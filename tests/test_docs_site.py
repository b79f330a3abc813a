"""The documentation site (``mkdocs.yml``, ``docs/``), checked statically without mkdocs: the
nav's pages exist and every page is reachable, the API reference covers every public name,
the relative links between pages resolve inside ``docs/``, and the home page quotes the
README's commands and example. (``mkdocs build --strict`` in ``.ci/run`` checks the rest:
that every reference resolves, anchors included.)"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import bilevel as bl
from bilevel.solvers import registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
CONFIG = (ROOT / "mkdocs.yml").read_text()

#: the modules whose every public name (``__all__``) the reference documents, by the import
#: path the reference uses (``bl.sets`` lives in ``bilevel.core.sets`` and is published as
#: ``bilevel.sets``)
MODULES = [
    "bilevel",
    "bilevel.solvers",
    "bilevel.problems",
    "bilevel.sets",
    "bilevel.metrics",
    "bilevel.meta",
    "bilevel.data",
    "bilevel.schedules",
    "bilevel.oracles",
]


def _block(text: str, key: str) -> str:
    """The lines of the top-level YAML key ``key`` of ``mkdocs.yml`` (up to the next one)."""
    match = re.search(rf"^{key}:.*?\n(.*?)(?=^\S|\Z)", text, re.S | re.M)
    assert match, f"mkdocs.yml has no {key}:"
    return match.group(1)


def nav_pages() -> list[str]:
    """The pages the nav of ``mkdocs.yml`` lists (paths relative to ``docs/``)."""
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", _block(CONFIG, "nav"), re.M)


def _patterns(key: str) -> list[str]:
    """The gitignore-style patterns of a ``key: |`` block of ``mkdocs.yml``."""
    return [line.strip() for line in _block(CONFIG, key).splitlines() if line.strip()]


def _matches(page: str, patterns: list[str]) -> bool:
    """Whether ``page`` (relative to docs/) matches one of the patterns, by gitignore's rules
    as far as mkdocs.yml uses them: ``name/`` is a folder, ``*`` a glob within one folder, and
    a slash at the start or inside anchors the pattern at docs/."""
    for pattern in patterns:
        folder = pattern.endswith("/")
        anchored = "/" in pattern.rstrip("/")
        words = Path(pattern.strip("/")).parts
        parts = Path(page).parts[:-1] if folder else Path(page).parts
        for start in [0] if anchored else range(len(parts)):
            end = start + len(words)
            if end > len(parts) or not (folder or end == len(parts)):
                continue
            if Path(*parts[start:end]).match("/".join(words)):
                return True
    return False


def site_pages() -> list[str]:
    """Every Markdown page of the site: ``docs/**/*.md`` less ``exclude_docs``."""
    excluded = _patterns("exclude_docs")
    pages = [p.relative_to(DOCS).as_posix() for p in sorted(DOCS.rglob("*.md"))]
    return [page for page in pages if not _matches(page, excluded)]


def reference_text() -> str:
    return "\n".join(p.read_text() for p in sorted(REFERENCE.glob("*.md")))


def documented() -> list[str]:
    """The identifiers of every ``::: identifier`` block of the reference pages."""
    return re.findall(r"^::: ([\w.]+)\s*$", reference_text(), re.M)


# ---- the nav ---------------------------------------------------------------------------------
def test_every_page_in_the_nav_exists():
    pages = nav_pages()
    assert len(pages) > 20 and "index.md" in pages and "gallery/index.md" in pages
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav lists pages that do not exist: {missing}"
    assert len(set(pages)) == len(pages), "a page is listed twice in the nav"


def test_every_page_is_in_the_nav():
    """What mkdocs' ``validation.omitted_files: warn`` would fail the build on."""
    listed = set(nav_pages())
    allowed = _patterns("not_in_nav")
    orphans = [p for p in site_pages() if p not in listed and not _matches(p, allowed)]
    assert not orphans, f"pages missing from mkdocs.yml's nav: {orphans}"


def test_the_papers_and_guides_are_in_the_nav():
    pages = set(nav_pages())
    for paper in ("stable", "pzobo", "ibcg", "f2obo", "f2sa"):
        assert f"algorithms/{paper}.md" in pages
    for page in (
        "concepts.md",
        "solvers.md",
        "performance.md",
        "performance_scale.md",
        "distributed.md",
        "online.md",
        "meta_learning.md",
        "runs.md",
        "step_sizes.md",
        "rates.md",
        "reproduction.md",
        "architecture.md",
        "dependencies.md",
        "testing.md",
        "adding_a_solver.md",
        "reference/index.md",
    ):
        assert page in pages, page


# ---- the API reference -----------------------------------------------------------------------
def resolve(identifier: str):
    """The object a ``::: identifier`` block documents: the longest importable module prefix,
    then attributes. (``bilevel.problems.quadratic`` is the function there, as Python sees it,
    while the reference, reading the source, would take the submodule of that name: the pages
    name such functions by their module, ``bilevel.problems.quadratic.quadratic``.)"""
    parts = identifier.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for part in parts[k:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(identifier)


def _is_shadowed(identifier: str) -> bool:
    """Whether the source has a submodule where Python has another object of that name (a
    function re-exported over its module's name), which the reference would document instead."""
    parts = identifier.split(".")
    package = importlib.import_module(".".join(parts[:-1]))
    path = getattr(package, "__path__", None)
    return bool(path) and any((Path(p) / f"{parts[-1]}.py").is_file() for p in path)


@pytest.mark.parametrize("module", MODULES)
def test_the_reference_covers_every_public_name(module):
    mod = bl if module == "bilevel" else getattr(bl, module.split(".")[1])
    blocks = documented()
    objects = {id(resolve(identifier)) for identifier in blocks}
    missing = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        if module == "bilevel" and type(obj) is type(bl):  # a module: a page of its own
            if f"bilevel.{name}" not in blocks:
                missing.append(f"bilevel.{name} (its page's `::: bilevel.{name}` block)")
        elif id(obj) not in objects:
            missing.append(f"{module}.{name}")
    assert not missing, f"not in docs/reference/*.md as `::: name` blocks: {missing}"


def test_every_registered_solver_class_is_documented():
    blocks = set(documented())
    for row in registry.table():
        assert f"bilevel.solvers.{row.cls.__name__}" in blocks, row.name


@pytest.mark.parametrize("identifier", documented())
def test_every_reference_block_names_what_it_means(identifier):
    """A ``::: path`` whose object was renamed or removed fails (mkdocs would too), and so does
    one that the reference would read as a module where Python has a function."""
    assert resolve(identifier) is not None
    if type(resolve(identifier)) is not type(bl):
        assert not _is_shadowed(identifier), (
            f"`::: {identifier}` would document the submodule of that name; name the object "
            "by its module instead"
        )


def test_the_solver_index_links_to_the_reference():
    """docs/solvers.md links every class to its ``::: bilevel.solvers.Class`` anchor."""
    index = (DOCS / "solvers.md").read_text()
    blocks = set(documented())
    links = re.findall(r"\]\(reference/solvers\.md#([\w.]+)\)", index)
    assert len(links) == len(registry.names("all"))
    assert all(anchor in blocks for anchor in links)


# ---- links between pages ---------------------------------------------------------------------
def _links(text: str) -> list[str]:
    """The targets of the Markdown links and images of ``text``, code spans and blocks left
    out."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", site_pages())
def test_relative_links_stay_inside_the_site_and_resolve(page):
    """A link to ``../src/...`` or ``../benchmarks/...`` works on GitHub but not on the site:
    name such files in code spans, or link the API reference."""
    path = DOCS / page
    bad = []
    for target in _links(path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file = (path.parent / target.split("#")[0]).resolve()
        if DOCS.resolve() not in file.parents or not file.exists():
            bad.append(target)
    assert not bad, f"{page}: links outside docs/ or to missing files: {bad}"


# ---- the home page ---------------------------------------------------------------------------
def test_the_home_page_quotes_the_readme():
    """The site's getting-started page shows the README's two set-up commands and its first
    example verbatim (tests/test_readme.py runs that example)."""
    readme = (ROOT / "README.md").read_text()
    home = (DOCS / "index.md").read_text()
    setup = re.search(r"^## Set-up\n(.*?)^## ", readme, re.S | re.M).group(1)
    commands = re.findall(r"^    (pip install -e .*)$", setup, re.M)
    assert len(commands) == 2
    for command in commands:
        assert f"    {command}\n" in home, command
    example = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert f"```python\n{example}```" in home
