"""The gallery: every script of ``examples/`` runs in quick mode, and its page is current.

Each example runs as a user would run it (as ``__main__``, from the repository root) with
``BILEVEL_EXAMPLES_QUICK=1`` (each script says what that shrinks),
``BILEVEL_IGNORE_SYSTEM_DATA=1`` (the stand-in data path: scikit-learn's digits where a script
would take Fashion-MNIST, the same on every machine) and ``BILEVEL_EXAMPLES_OUT`` set to a
temporary directory. Each test then checks its example's exit, its figure and its key number
(:data:`KEY_NUMBERS`: finite, and improved from start to end).

CPU time is what the budget counts (about a minute for this file), and most of a quick run is
JAX importing and XLA compiling. So all examples but those that must configure JAX before
importing it (:data:`OWN_PROCESS`) run one after another in ONE Python process, which imports
jax, the library, scikit-learn and matplotlib once, with ``runpy.run_path(...,
run_name="__main__")`` (what ``python examples/x.py`` runs) and a marker line around each one's
output; the other processes run alongside it. ``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` lowers XLA's
optimisation level: compiling is most of a quick run, and slower compiled code costs little in
runs this short. Measured 2026-11-27 on the 2-core machine at load average 5 (CPU seconds, user
+ system): the ten examples as ten processes 89 s, as one shared process plus one 57 s; the
whole file 63-66 s (without the optimisation level lowered: 86 s for the nine shared ones
alone, against 49 s).
"""

from __future__ import annotations

import ast
import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
STEMS = [path.stem for path in EXAMPLES]
#: examples that set XLA_FLAGS before importing jax: each gets a process of its own
OWN_PROCESS = {"data_parallel_devices"}
#: the printed line ``<label>: <start> -> <end>`` (or ``<label>: <value>``) that shows each
#: example did its job, and how to judge it: "decrease" / "increase" (end strictly better than
#: start, both finite), ("below", b) / ("above", b) (the last number on the line)
KEY_NUMBERS = {
    "data_parallel_devices": [
        ("validation loss (4 devices)", "decrease"),
        ("largest difference of the final x, 4 devices vs 1", ("below", 1e-4)),
    ],
    "equinox_models": [("exact hypergradient norm", "decrease")],
    # 3 meta-steps on 2 tasks each move the accuracy by less than its noise over 8 tasks: well
    # above chance (1/4) is what a quick run can show
    "few_shot_pzobo_meta": [("meta-test accuracy on unseen classes", ("above", 0.4))],
    "hyper_cleaning_fashion_mnist": [
        ("mean weight of corrupted images", "decrease"),
        ("validation loss", "decrease"),
    ],
    "ibcg_simplex_sources": [("Frank-Wolfe gap (exact)", "decrease")],
    "matrix_completion_nuclear": [("normalized error on all entries", "decrease")],
    "online_f2obo_stream": [("regret per round, first tenth -> last tenth", "decrease")],
    "ridge_penalty_diabetes": [("exact hypergradient norm", "decrease")],
    "sweep_step_sizes": [("exact objective F (mean over seeds)", "decrease")],
    "unrolled_step_sizes": [("F(x_K) - F*", "decrease")],
}
REGENERATE = "python docs/scripts/build_gallery.py --only {stem}"

# Runs the scripts given as arguments one after another, each as __main__, between marker lines;
# an exception ends that script only. jax's float width and matplotlib's figures are reset
# between scripts, so that one cannot change what the next one does.
RUNNER = r"""
import os, runpy, sys, traceback
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import jax
x64 = jax.config.jax_enable_x64
for path in sys.argv[1:]:
    stem = os.path.splitext(os.path.basename(path))[0]
    print(f"\n=== begin {stem}", flush=True)
    sys.argv = [path]
    status = "ok"
    try:
        runpy.run_path(path, run_name="__main__")
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        status = "failed"
    finally:
        plt.close("all")
        jax.config.update("jax_enable_x64", x64)
    print(f"\n=== end {stem} {status}", flush=True)
"""


def _env(out: Path) -> dict:
    # XLA_FLAGS from conftest.py (single-threaded Eigen, as the suite); no $BILEVEL_DATA, so
    # that every machine runs the examples on the same data (few_shot_data would take a
    # miniImageNet found there)
    env = {k: v for k, v in os.environ.items() if k not in ("BILEVEL_DATA", "BILEVEL_TRUST_PICKLE")}
    env.update(
        BILEVEL_EXAMPLES_QUICK="1",
        BILEVEL_IGNORE_SYSTEM_DATA="1",
        BILEVEL_EXAMPLES_OUT=str(out),
        JAX_PLATFORMS="cpu",  # 4 host devices for data_parallel_devices, also beside a GPU
        JAX_DISABLE_MOST_OPTIMIZATIONS="1",
        MPLBACKEND="Agg",
    )
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[str, Path]]:
    """``{stem: (its output, the output directory)}`` of every example's quick run (a failed
    run's output ends with its traceback and ``FAILED``)."""
    out = tmp_path_factory.mktemp("examples")
    shared = [str(p) for p in EXAMPLES if p.stem not in OWN_PROCESS]
    procs = {"shared": [sys.executable, "-c", RUNNER, *shared]}
    for path in EXAMPLES:
        if path.stem in OWN_PROCESS:
            procs[path.stem] = [sys.executable, str(path)]
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = {
        name: subprocess.Popen(cmd, cwd=ROOT, env=_env(out), **pipes) for name, cmd in procs.items()
    }
    results = {}
    for name, proc in started.items():
        try:
            text, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            text = proc.communicate()[0] + "\nTIMED OUT after 600 s\nFAILED"
        if name == "shared":
            for stem, body, status in re.findall(
                r"^=== begin (\S+)\n(.*?)^=== end \1 (\S+)$", text, re.S | re.M
            ):
                results[stem] = (body + ("" if status == "ok" else "\nFAILED"), out)
            for path in shared:  # a crash of the whole process leaves some without an end
                results.setdefault(Path(path).stem, (text + "\nFAILED (no end marker)", out))
        else:
            results[name] = (text + ("" if proc.returncode == 0 else "\nFAILED"), out)
    return results


def _numbers(output: str, label: str) -> list[float]:
    """The numbers after ``<label>: `` on the line that starts with it."""
    match = re.search(rf"^{re.escape(label)}: (.*)$", output, re.M)
    assert match, f"no line starting with {label!r}: in the output:\n{output}"
    rest = match.group(1)
    if " -> " in rest:
        return [float(re.match(r"\s*(\S+?)[,;)]?(\s|$)", s).group(1)) for s in rest.split(" -> ")]
    return [float(re.match(r"\s*(\S+?)[,;)]?(\s|$)", rest).group(1))]


def test_at_least_ten_examples():
    assert len(EXAMPLES) >= 10, f"the gallery needs 10 examples, examples/ has {STEMS}"


def test_every_example_declares_its_key_numbers():
    assert sorted(KEY_NUMBERS) == STEMS, (
        "each example names the printed number that shows it worked in KEY_NUMBERS of "
        "tests/test_examples.py (and only existing examples do)"
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=STEMS)
def test_docstring_says_what_it_is_and_what_quick_mode_shrinks(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc, f"{path.name} needs a module docstring"
    for needed in ("Task:", "Method:", f"python examples/{path.name}", "BILEVEL_EXAMPLES_QUICK=1"):
        assert needed in doc, f"{path.name}'s docstring does not mention {needed!r}"


@pytest.mark.parametrize("stem", STEMS)
def test_example_runs_in_quick_mode(runs, stem):
    output, out = runs[stem]
    assert "FAILED" not in output, f"examples/{stem}.py failed in quick mode:\n{output}"
    assert re.search(r"^quick mode: \S", output, re.M), f"{stem} printed no 'quick mode: ...'"
    figure = out / f"{stem}.png"
    assert figure.is_file() and figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
    for label, judge in KEY_NUMBERS[stem]:
        values = _numbers(output, label)
        assert all(math.isfinite(v) for v in values), f"{stem}: {label}: {values}"
        if judge == "decrease":
            assert values[-1] < values[0], f"{stem}: {label} did not decrease: {values}"
        elif judge == "increase":
            assert values[-1] > values[0], f"{stem}: {label} did not increase: {values}"
        else:
            kind, bound = judge
            ok = values[-1] < bound if kind == "below" else values[-1] > bound
            assert ok, f"{stem}: {label} = {values[-1]} is not {kind} {bound}"


def _gallery():
    spec = importlib.util.spec_from_file_location(
        "build_gallery", ROOT / "docs" / "scripts" / "build_gallery.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", EXAMPLES, ids=STEMS)
def test_gallery_page_shows_the_current_script(path):
    """The page embeds the script as it is now, and its figure is there: a page cannot go
    stale. Fix: regenerate it (it runs the script in full mode)."""
    page = ROOT / "docs" / "gallery" / f"{path.stem}.md"
    fix = REGENERATE.format(stem=path.stem)
    assert page.is_file(), f"docs/gallery/{path.stem}.md is missing; run `{fix}`"
    source = _gallery().source_in_page(page.read_text())
    assert source == path.read_text(), (
        f"docs/gallery/{path.stem}.md shows another version of examples/{path.name}; run `{fix}`"
    )
    assert (ROOT / "docs" / "gallery" / f"{path.stem}.png").is_file(), f"run `{fix}`"


def test_gallery_index_lists_every_example():
    index = (ROOT / "docs" / "gallery" / "index.md").read_text()
    assert index == _gallery().index(EXAMPLES), (
        "docs/gallery/index.md is not the index of the current examples; run "
        "`python docs/scripts/build_gallery.py` (or with --only NAME for the examples that "
        "changed: the index is rewritten every time)"
    )
