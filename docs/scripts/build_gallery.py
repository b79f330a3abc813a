"""Build the gallery's pages from the example scripts: run each, and write its page.

For every ``examples/<stem>.py`` this runs the script in its own process (full mode by default,
``--quick`` for ``BILEVEL_EXAMPLES_QUICK=1``), captures its standard output and its figure, and
writes ``docs/gallery/<stem>.md``: the title (the docstring's first line), the rest of the
docstring, the figure (``<stem>.png``, copied next to the page), the output and the full source.
``docs/gallery/index.md`` gets one table row per example: its page, what it shows (the title),
its method (the start of the docstring's "Method:" paragraph) and the entry points of the
library it calls.

    python docs/scripts/build_gallery.py                  # every example, full mode (minutes)
    python docs/scripts/build_gallery.py --only equinox_models --only sweep_step_sizes
    python docs/scripts/build_gallery.py --quick          # quick mode (a smoke run)

``tests/test_examples.py`` checks that every example has a page whose source is the script's
current text, so a page cannot go stale: edit an example, then run this script for it.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GALLERY = ROOT / "docs" / "gallery"
#: the fences of the source and output blocks: four backticks, so that a script or an output
#: containing three cannot end them early (tests/test_examples.py reads the source block back)
SOURCE_FENCE, OUTPUT_FENCE = "````python", "````text"
#: the entry points the index lists when a script calls them
ENTRY_POINTS = {
    "bl.solve(": "`bl.solve`",
    "bl.solve_online(": "`bl.solve_online`",
    "bl.sweep(": "`bl.sweep`",
    "bl.iterate(": "`bl.iterate`",
    "bl.meta.": "`bl.meta`",
    "devices=": "`devices=`",
    "bl.metrics.": "`bl.metrics`",
}


def docstring(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise SystemExit(f"{path} has no module docstring (the gallery takes its text from it)")
    return doc


def paragraph(doc: str, label: str, path: Path) -> str:
    """The paragraph of ``doc`` that starts with ``label`` ("Task:"), without the label."""
    for block in re.split(r"\n\s*\n", doc):
        if block.startswith(label):
            return " ".join(block[len(label) :].split())
    raise SystemExit(f"{path}: its docstring needs a paragraph starting with {label!r}")


def escape_markdown(text: str) -> str:
    """The docstring as Markdown: ``*`` and ``_`` outside code (backticks, indented blocks)
    escaped, so that ``w*(x) ... y*(x)`` is not read as emphasis."""
    lines = []
    for line in text.splitlines():
        if line.startswith("    "):  # an indented block: rendered as code, literally
            lines.append(line)
            continue
        parts = line.split("`")
        for i in range(0, len(parts), 2):  # the even parts are outside backticks
            parts[i] = parts[i].replace("*", r"\*").replace("_", r"\_")
        lines.append("`".join(parts))
    return "\n".join(lines)


def run(path: Path, quick: bool) -> tuple[str, Path, float]:
    """Run the script as a user would (its own process, its own directory for the figure):
    ``(stdout, figure, seconds)``."""
    out = Path(tempfile.mkdtemp(prefix=f"gallery-{path.stem}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BILEVEL_EXAMPLES_")}
    if quick:
        env["BILEVEL_EXAMPLES_QUICK"] = "1"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(path)], cwd=out, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{path.name} failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}")
    figure = out / f"{path.stem}.png"
    if not figure.is_file():
        raise SystemExit(f"{path.name} wrote no {figure.name}")
    return proc.stdout, figure, seconds


def page(path: Path, output: str) -> str:
    doc = docstring(path)
    title, _, body = doc.partition("\n")
    title = title.strip().rstrip(".")
    source = path.read_text()
    return (
        f"# {title}\n\n"
        f"{escape_markdown(body.strip())}\n\n"
        f"![The figure of {path.name}]({path.stem}.png)\n\n"
        "## Output\n\n"
        f"{OUTPUT_FENCE}\n{output.rstrip()}\n````\n\n"
        f"## Source: `examples/{path.name}`\n\n"
        f"{SOURCE_FENCE}\n{source.rstrip()}\n````\n"
    )


def source_in_page(text: str) -> str | None:
    """The script's source as embedded in a page written by :func:`page` (None if absent)."""
    start = text.find(SOURCE_FENCE + "\n")
    end = text.rfind("\n````")
    if start < 0 or end <= start:
        return None
    return text[start + len(SOURCE_FENCE) + 1 : end] + "\n"


def index(paths: list[Path]) -> str:
    rows = []
    for path in paths:
        doc, source = docstring(path), path.read_text()
        title = doc.partition("\n")[0].strip().rstrip(".")
        method = re.split(r" \(|, ", paragraph(doc, "Method:", path), maxsplit=1)[0]
        api = ", ".join(v for k, v in ENTRY_POINTS.items() if k in source)
        rows.append(f"| [`{path.name}`]({path.stem}.md) | {title} | {method} | {api} |")
    return (
        "# Gallery\n\n"
        "Short scripts, each a task a researcher would copy, written with the public API only "
        "(`import bilevel as bl`). Each page shows the script, what it printed and its figure, "
        "from a full run. Run one with `python examples/<name>.py` from the repository root; "
        "it writes its figure to `$BILEVEL_EXAMPLES_OUT` (default: the current directory). "
        "`BILEVEL_EXAMPLES_QUICK=1` shrinks each (the script says how): `tests/test_examples.py` "
        "runs every one that way.\n\n"
        "| Example | What it shows | Solver / method | Entry points |\n"
        "|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "The pages are generated: `python docs/scripts/build_gallery.py` runs the scripts and "
        "writes them (`--only <name>` for one).\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="BILEVEL_EXAMPLES_QUICK=1")
    parser.add_argument("--only", action="append", metavar="STEM", help="these examples only")
    args = parser.parse_args()
    paths = sorted(EXAMPLES.glob("*.py"))
    chosen = [p for p in paths if not args.only or p.stem in args.only]
    unknown = set(args.only or ()) - {p.stem for p in paths}
    if unknown:
        names = ", ".join(p.stem for p in paths)
        raise SystemExit(f"no examples/{sorted(unknown)[0]}.py; the examples: {names}")
    GALLERY.mkdir(parents=True, exist_ok=True)
    for path in chosen:
        output, figure, seconds = run(path, args.quick)
        shutil.copyfile(figure, GALLERY / figure.name)
        shutil.rmtree(figure.parent, ignore_errors=True)
        (GALLERY / f"{path.stem}.md").write_text(page(path, output))
        print(f"{path.stem}: {seconds:.1f} s", flush=True)
    (GALLERY / "index.md").write_text(index(paths))
    print(f"wrote {len(chosen)} page(s) and the index in {GALLERY.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
