"""The ``bilevel`` command: list solvers and problems, run a solver, reproduce experiments."""

from __future__ import annotations

import ast
import contextlib
import json
import math
import re
from pathlib import Path

import numpy as np
import typer

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Gradient-based bilevel optimization in JAX."
)


def _literal(raw: str):
    """A Python literal when ``raw`` parses as one, else the string itself."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


def _parse_options(options: list[str]) -> dict:
    """``key=value`` pairs; values are Python literals when they parse, else strings."""
    out = {}
    for item in options:
        if "=" not in item:
            raise ValueError(f"--opt and --problem-opt take key=value, got {item!r}.")
        key, raw = item.split("=", 1)
        out[key.strip()] = _literal(raw)
    return out


#: ``solve``'s and the solvers' argument names that ``bilevel run`` exposes as flags
_RUN_FLAGS = ("steps", "seeds", "eval_every", "lr_outer", "lr_inner", "batch_size", "devices")


def _with_flag_names(message: str) -> str:
    """Library messages name API arguments (``solve(steps=...)``, ``F2SA(lr_outer=...)``,
    ``batch_size=32``); on the command line the flags (``--steps``) are what a user can change.
    Other solver options are set with ``--opt NAME=VALUE``."""
    import bilevel as bl

    solver_classes = {bl.solvers.get(name).__name__ for name in bl.solvers.names()}

    def flag(match: re.Match) -> str:
        owner, name = match.group(1), match.group(2)
        if name in _RUN_FLAGS and (owner in ("solve", "sweep") or owner in solver_classes):
            return f"--{name.replace('_', '-')}"
        if (owner, name) == ("solve", "checkpoint"):  # OUT/checkpoint
            return f"--out's checkpoint directory {match.group(3)}"
        return f"--opt {name}=..." if owner in solver_classes else match.group(0)

    message = re.sub(r"\b(\w+)\((\w+)=(\.\.\.|[^)]*)\)", flag, message)
    message = re.sub(
        r"(?<![-\w])(batch_size|lr_outer|lr_inner)=",
        lambda m: "--" + m.group(1).replace("_", "-") + "=",
        message,
    )
    message = message.replace(
        "use another checkpoint directory.", "use another --out, or --no-checkpoint."
    )
    return message.replace(
        "use another checkpoint directory", "use another --out, or --no-checkpoint,"
    )


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


@contextlib.contextmanager
def _bad_input_as_message(flags: bool = False):
    """Bad input (ValueError/TypeError from the library, a missing dataset) ends with one line
    ``error: ...`` and exit code 2, not a traceback; ``flags`` rewrites argument names as the
    command's flags."""
    from bilevel.data import DatasetNotFoundError

    try:
        yield
    except (ValueError, TypeError, DatasetNotFoundError) as err:
        text = _one_line(err)
        typer.echo(f"error: {_with_flag_names(text) if flags else text}", err=True)
        raise typer.Exit(code=2) from err


@contextlib.contextmanager
def _os_errors_as_message():
    """An ``OSError`` (a full disk, a read-only directory, no permission) ends the command
    with one line naming the path and the errno, and exit code 1, not a traceback."""
    try:
        yield
    except OSError as err:
        typer.echo(f"error: {_os_error_text(err)}", err=True)
        raise typer.Exit(code=1) from err


def _check_run_flags(
    steps: int, seeds: int, eval_every: int | None, out: Path, checkpoint_every: float = 30.0
) -> int:
    """The flags ``run`` and ``sweep`` share (and ``run``'s ``--checkpoint-every``), checked
    before anything is imported or built; returns the evaluation interval (default: steps/100,
    so a figure has ~100 points)."""
    for flag, value in (("--steps", steps), ("--seeds", seeds), ("--eval-every", eval_every)):
        if value is not None and value < 1:
            _fail(f"{flag} must be a positive integer, got {value}.")
    if not checkpoint_every > 0:  # NaN too
        _fail(f"--checkpoint-every must be a positive number of seconds, got {checkpoint_every}.")
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file; give a directory for the outputs.")
    return eval_every if eval_every is not None else max(1, steps // 100)


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@app.command()
def solvers(
    long: bool = typer.Option(
        False, "--long", help="every solver with its class, family, file and paper"
    ),
) -> None:
    """List the registered solvers."""
    import bilevel as bl

    if long:  # the registry's table, as docs/solvers.md lists it
        typer.echo(bl.solvers.registry.format_table(bl.solvers.registry.table()))
        return
    for name in bl.solvers.names():
        cls = bl.solvers.get(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        typer.echo(f"{name:12s} {doc}")
    typer.echo("online solvers (streams: bl.solve_online in Python, not `bilevel run`):")
    for name in bl.solvers.names("online"):
        doc = (bl.solvers.get(name).__doc__ or "").strip().splitlines()[0]
        typer.echo(f"{name:12s} {doc}")


@app.command()
def problems() -> None:
    """List the problems ``bilevel run --problem`` can build."""
    import bilevel as bl

    for name in bl.problems.names():
        typer.echo(f"{name:22s} {bl.problems.describe(name)}")


# long: a typer command's options are its signature, one per flag
@app.command()
def run(
    problem: str = typer.Option("quadratic", help="problem name (see `bilevel problems`)"),
    solver: str = typer.Option("f2sa", help="solver name (see `bilevel solvers`)"),
    steps: int = typer.Option(2000, help="outer iterations"),
    seeds: int = typer.Option(1, help="number of seeds (0, 1, ...), run as one vmapped program"),
    eval_every: int = typer.Option(
        None, help="steps between evaluations (default: steps/100, at least 1)"
    ),
    lr_outer: float = typer.Option(None, help="outer step size (default: the problem's hint)"),
    lr_inner: float = typer.Option(None, help="inner step size (default: the problem's hint)"),
    batch_size: int = typer.Option(None, help="minibatch size (default: full data)"),
    opt: list[str] = typer.Option([], help="other solver hyperparameters, key=value"),
    problem_opt: list[str] = typer.Option([], help="problem options, key=value"),
    out: Path = typer.Option(Path("runs/latest"), help="output directory"),
    checkpoint: bool = typer.Option(
        True, help="checkpoint into OUT/checkpoint and resume from it when rerun"
    ),
    checkpoint_every: float = typer.Option(
        30.0,
        metavar="SECONDS",
        help="write the checkpoint at most every SECONDS (> 0) of wall time; it is also "
        "written at the end and on Ctrl-C/SIGTERM",
    ),
    progress: bool = typer.Option(True, help="show progress on stderr"),
    devices: int = typer.Option(
        None,
        help="split every minibatch over this many devices (on CPU: "
        "XLA_FLAGS=--xla_force_host_platform_device_count=K); docs/distributed.md",
    ),
    log_to: Path = typer.Option(
        None,
        metavar="DIR",
        help="stream the history to TensorBoard event files in DIR (one run per seed; watch "
        "with `tensorboard --logdir DIR`); needs pip install 'bilevel[tensorboard]'",
    ),
) -> None:
    """Run SOLVER on PROBLEM; write history (CSV, parquet), a PNG plot and a JSON summary.

    Ctrl-C (or SIGTERM) stops at the last evaluation, writes the outputs of the steps done and
    the checkpoint; the same command then resumes. A run owns OUT while it goes (the lock file
    OUT/bilevel.lock): a second run on the same OUT is refused.
    """
    every = _check_run_flags(steps, seeds, eval_every, out, checkpoint_every)
    _check_log_to(log_to)
    # the lock on out, held to the last output; an OSError of no file of its own: one line
    with _os_errors_as_message(), contextlib.ExitStack() as owned:
        with _bad_input_as_message(flags=True):
            import bilevel as bl
            from bilevel.drivers.writes import WriteError

            prob = bl.problems.make(problem, **_parse_options(problem_opt))
            hyper = _run_hyper(problem, lr_outer, lr_inner, batch_size, opt)
            slv = bl.solvers.make(solver, **hyper)
            _own_out(out, owned)
            try:
                res = bl.solve(
                    prob,
                    slv,
                    steps=steps,
                    seeds=range(seeds),
                    eval_every=every,
                    checkpoint=(out / "checkpoint") if checkpoint else None,
                    checkpoint_interval=checkpoint_every,
                    progress=progress,
                    devices=devices,
                    log_to=log_to,
                )
            except bl.Interrupted as stop:
                _exit_interrupted(stop, prob.name, steps, out)
            except WriteError as err:  # a checkpoint: the outputs of the steps done, one line
                _exit_unwritten(err, prob.name, out, checkpoint)
        _exit_unwritten(_write_run_outputs(res, prob.name, out), out=out, resumable=checkpoint)
    typer.echo(
        f"{res.message}; wrote {out}/history.csv, history.parquet, history.png, summary.json"
    )
    _echo_headline_metrics(res.history)


def _own_out(out: Path, owned: contextlib.ExitStack) -> None:
    """``out`` created and locked for this run until ``owned`` closes (a ``RunLock``): refused,
    as one line, while another live run holds it (``DirectoryInUse``, a ValueError) or when
    it cannot be written (read-only, no permission, a full disk); a stale lock is taken over,
    with a line."""
    from bilevel.drivers.run_lock import RunLock

    try:
        out.mkdir(parents=True, exist_ok=True)
        owned.enter_context(RunLock(out, "--out", log=lambda line: typer.echo(line, err=True)))
    except OSError as err:
        _fail(f"--out {out} is not writable ({_os_error_text(err)}); give another --out.")


def _os_error_text(err: OSError) -> str:
    """``err`` as one line: ``cannot write PATH: [Errno N] reason`` for a ``WriteError``,
    ``PATH: [Errno N] reason`` for another ``OSError`` with a file name."""
    from bilevel.drivers.writes import WriteError

    if isinstance(err, WriteError) or not err.filename:
        return _one_line(err)
    code = f"[Errno {err.errno}] " if err.errno else ""
    return f"{err.filename}: {code}{err.strerror or _one_line(err)}"


def _exit_unwritten(
    failed, problem_name: str = "", out: Path | None = None, resumable: bool = False
) -> None:
    """Nothing when ``failed`` (a list of ``WriteError``) is empty. Otherwise one line naming
    the first file that could not be written and its errno (and the others not written), then
    exit code 1. ``failed`` may be the ``WriteError`` of a checkpoint write of ``bl.solve``:
    the outputs of the steps done are written first (what can be), and the previous checkpoint
    stays, so the same command resumes once the fault is gone."""
    from bilevel.drivers.writes import WriteError

    if isinstance(failed, WriteError):
        err, failed = failed, [failed]
        if err.result is not None and out is not None:
            err.result.message += f"; then {err}"
            failed += _write_run_outputs(err.result, problem_name, out)
    if not failed:
        return
    typer.echo(_unwritten_line(failed, resumable), err=True)
    raise typer.Exit(code=1)


def _unwritten_line(failed: list, resumable: bool) -> str:
    """``error: cannot write PATH: [Errno N] reason (not written either: ...)[; rerun ...]``."""
    first, rest = failed[0], failed[1:]
    also = f" (not written either: {', '.join(e.path.name for e in rest)})" if rest else ""
    resume = "; rerun the same command to resume" if resumable else ""
    return f"error: {first}{also}{resume}"


def _check_log_to(log_to: Path | None) -> None:
    """``--log-to`` is a directory (created now) and tensorboardX is installed; otherwise one
    line (the extra to install) and exit code 2, before anything is built."""
    if log_to is None:
        return
    if log_to.exists() and not log_to.is_dir():
        _fail(f"--log-to {log_to} is a file; give a directory for the TensorBoard events.")
    from bilevel.drivers.loggers import EXTRA, require_tensorboardx

    try:
        require_tensorboardx()
    except ImportError:
        _fail(f"--log-to writes TensorBoard events with tensorboardX, not installed: {EXTRA}")
    try:
        log_to.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _fail(f"--log-to {log_to} cannot be created ({err.strerror or err}); give another DIR.")


def _run_hyper(problem: str, lr_outer, lr_inner, batch_size, opt: list[str]) -> dict:
    """``run``'s solver hyperparameters: the problem's step-size hints, overridden by the
    flags given, then by ``--opt`` pairs."""
    import bilevel as bl

    hints = dict(bl.problems.solver_hints(problem))
    hyper = {k: v for k, v in hints.items() if k in ("lr_outer", "lr_inner")}
    for key, value in (("lr_outer", lr_outer), ("lr_inner", lr_inner), ("batch_size", batch_size)):
        if value is not None:
            hyper[key] = value
    hyper.update(_parse_options(opt))
    return hyper


def _exit_interrupted(stop, problem_name: str, steps: int, out: Path) -> None:
    """Write the outputs of the steps done, say how to resume, and exit with code 130."""
    failed = _write_run_outputs(stop.result, problem_name, out, interrupted=True)
    typer.echo(f"{stop.signal}: stopped at step {stop.result.steps} of {steps}.", err=True)
    if failed:  # one line, as after a run
        typer.echo(_unwritten_line(failed, resumable=False), err=True)
    else:
        typer.echo(f"wrote {out}/history.csv, .parquet, .png and summary.json")
    if stop.checkpoint is not None:
        typer.echo(f"checkpoint: {stop.checkpoint}; rerun the same command to resume.")
    else:
        typer.echo("no checkpoint (--no-checkpoint): a rerun starts from step 0.")
    raise typer.Exit(code=130) from None


def _echo_headline_metrics(history) -> None:
    """Each headline metric's seed mean at step 0 and at the last step."""
    last = history[history.step == history.step.max()]
    for col in ("grad_norm", "x_err", "F_gap", "outer_loss"):
        if col in last:
            first = history[history.step == 0][col].mean()
            typer.echo(
                f"  {col}: {first:.4e} -> {last[col].mean():.4e} (mean over {len(last)} seed(s))"
            )


def _write_run_outputs(res, problem_name: str, out: Path, interrupted: bool = False) -> list:
    """history.csv / .parquet, summary.json and history.png (one panel per headline metric),
    in that order, each whole or not at all; a file that cannot be written (an ``OSError``)
    does not stop the next. The failures (``WriteError``s; empty when all were written)."""
    from bilevel.drivers.writes import write_each
    from bilevel.experiments.report import plot_run

    history, summary = res.history, _summary(res, problem_name, interrupted)

    def plot(path: Path) -> None:
        plot_run(history, path, label=res.solver.name, title=problem_name)

    return write_each(
        [
            (out / "history.csv", lambda path: history.to_csv(path, index=False)),
            (out / "history.parquet", lambda path: history.to_parquet(path, index=False)),
            (out / "summary.json", lambda path: path.write_text(summary)),
            (out / "history.png", plot),
        ]
    )


def _summary(res, problem_name: str, interrupted: bool) -> str:
    """summary.json's text."""
    last = res.history[res.history.step == res.history.step.max()]
    summary = {
        "problem": problem_name,
        "solver": repr(res.solver),
        "steps": res.steps,
        "interrupted": interrupted,
        "seeds": res.seeds,
        "diverged": res.diverged,
        "message": res.message,
        "final_mean": {c: float(last[c].mean()) for c in last.columns if c not in ("seed",)},
        "tuning": _tuning_summary(getattr(res, "tuning", None)),
    }
    return json.dumps(summary, indent=2)


def _tuning_summary(tuning) -> dict | None:
    """What chose ``lr_outer`` (``res.tuning``), JSON-able; ``None`` when it was given."""
    if tuning is None:
        return None
    return {
        "summary": tuning.summary(),
        "value": tuning.value,
        "tail": None if tuning.tail is None else list(tuning.tail),
        "grid": list(tuning.grid),
        "scores": [None if s == float("inf") else s for s in tuning.scores],
        "dropped": list(tuning.dropped),
        "score": tuning.score,
        "steps": tuning.steps,
        "samples": tuning.samples,
        "seconds": tuning.seconds,
        "retries": list(tuning.retries),
        "finals": [f if math.isfinite(f) else None for f in tuning.finals],
    }


def _parse_grid(items: list[str]) -> dict:
    """``--grid NAME=V1,V2,...`` flags as ``{name: [values]}`` (values are Python literals)."""
    grid = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--grid takes NAME=V1,V2,..., got {item!r}.")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key in grid:
            raise ValueError(f"--grid {key}=... is given twice; list all its values in one flag.")
        values = [_literal(v) for v in raw.split(",") if v.strip()]
        if not values:
            raise ValueError(f"--grid {key}= has no values; give e.g. {key}=0.01,0.1.")
        grid[key] = values
    if not grid:
        raise ValueError("give at least one --grid NAME=V1,V2,... (e.g. --grid lr_outer=0.01,0.1).")
    return grid


@app.command()
def sweep(
    problem: str = typer.Option("quadratic", help="problem name (see `bilevel problems`)"),
    solver: str = typer.Option("f2sa", help="solver name (see `bilevel solvers`)"),
    grid: list[str] = typer.Option(
        [], help="a numeric hyperparameter and its values, NAME=V1,V2,... (repeat per field)"
    ),
    steps: int = typer.Option(2000, help="outer iterations"),
    seeds: int = typer.Option(1, help="number of seeds (0, 1, ...) at every grid point"),
    eval_every: int = typer.Option(
        None, help="steps between evaluations (default: steps/100, at least 1)"
    ),
    batch_size: int = typer.Option(None, help="minibatch size (default: full data)"),
    opt: list[str] = typer.Option([], help="other solver hyperparameters, key=value"),
    problem_opt: list[str] = typer.Option([], help="problem options, key=value"),
    out: Path = typer.Option(Path("runs/sweep"), help="output directory"),
    progress: bool = typer.Option(True, help="show progress on stderr"),
    devices: int = typer.Option(
        None,
        help="spread the grid points over this many devices (on CPU: "
        "XLA_FLAGS=--xla_force_host_platform_device_count=K); docs/distributed.md",
    ),
) -> None:
    """Run SOLVER on PROBLEM over a grid of hyperparameters x seeds as one vmapped program;
    write sweep.csv and sweep.png and print the best setting per metric.

    The best setting has the lowest final mean over seeds (a point where a seed diverged never
    wins). The figure is a heat map of the headline metric's final mean for a 2-field grid, a
    line plot for 1 field. Grid step sizes not given fall back to the problem's hints.
    """
    every = _check_run_flags(steps, seeds, eval_every, out)
    try:  # before the sweep runs: a directory it could not write is refused now
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        _fail(f"--out {out} cannot be created ({_os_error_text(err)}); give another --out.")
    with _os_errors_as_message(), _bad_input_as_message(flags=True):
        import bilevel as bl

        points = _parse_grid(grid)
        prob = bl.problems.make(problem, **_parse_options(problem_opt))
        hints = dict(bl.problems.solver_hints(problem))
        hyper = {k: v for k, v in hints.items() if k in ("lr_outer", "lr_inner")}
        if batch_size is not None:
            hyper["batch_size"] = batch_size
        hyper.update(_parse_options(opt))
        hyper = {k: v for k, v in hyper.items() if k not in points}
        df = bl.sweep(
            prob,
            solver,
            points,
            steps=steps,
            seeds=range(seeds),
            eval_every=every,
            progress=progress,
            devices=devices,
            **hyper,
        )
    _write_sweep_outputs(df, list(points), f"{solver} on {prob.name}", out)


def _write_sweep_outputs(df, fields: list[str], title: str, out: Path) -> None:
    """sweep.csv, sweep.png (1 or 2 fields) and the best setting per metric on stdout; a file
    that cannot be written (an ``OSError``) ends the command in one line, after the rest."""
    from bilevel.drivers.sweep import final_means
    from bilevel.drivers.writes import write_each
    from bilevel.experiments.report import plot_sweep

    final = final_means(df, fields)
    writes = [(out / "sweep.csv", lambda path: df.to_csv(path, index=False))]
    headline = next((m for m in ("grad_norm", "outer_loss") if m in final), None)
    if headline is not None and len(fields) in (1, 2):
        writes.append((out / "sweep.png", lambda path: plot_sweep(
            final, fields, headline, path, title=title)))  # fmt: skip
    failed = write_each(writes)
    written = [path.name for path, _ in writes if path not in {e.path for e in failed}]
    paths = ", ".join(f"{out}/{name}" for name in written) or "nothing"
    typer.echo(f"{len(final)} grid points x {df['seed'].nunique()} seed(s); wrote {paths}")
    typer.echo("best setting per metric (lowest final mean over seeds):")
    for metric in [c for c in final.columns if c not in fields]:
        values = final[metric].to_numpy(float)
        if not np.isfinite(values).any():
            typer.echo(f"  {metric}: every point diverged")
            continue
        best = final.iloc[int(np.nanargmin(np.where(np.isfinite(values), values, np.nan)))]
        setting = ", ".join(f"{f}={best[f]}" for f in fields)
        typer.echo(f"  {metric}: {best[metric]:.4e} at {setting}")
    _exit_unwritten(failed)


@app.command()
def reproduce(
    name: str = typer.Argument(None, help="experiment name, or 'all' (see --list)"),
    list_: bool = typer.Option(False, "--list", help="list the experiments and exit"),
    quick: bool = typer.Option(False, "--quick", help="a reduced run, labelled QUICK"),
    out: Path = typer.Option(Path("runs/reproduce"), help="output root (NAME/ is added)"),
    seeds: int = typer.Option(None, help="seeds per method (default: the experiment's)"),
) -> None:
    """Reproduce a paper's experiment: figures (PNG), curves (CSV) and claims.md."""
    from bilevel import experiments

    if list_ or name is None:
        for exp_name in experiments.names():
            exp = experiments.get(exp_name)
            typer.echo(f"{exp_name:26s} [{exp.paper}] {exp.description}")
        return
    todo = experiments.names() if name == "all" else [name]
    for exp_name in todo:
        with _os_errors_as_message(), _bad_input_as_message():  # a missing dataset: input
            result = experiments.run(
                exp_name, out / exp_name, quick=quick, seeds=seeds, log=typer.echo
            )
        typer.echo(
            f"{exp_name}: wrote {result.out_dir}/claims.md ({result.seconds:.0f} s"
            f"{', QUICK' if quick else ''})"
        )
        for claim in result.claims:
            typer.echo(f"  - {claim.claim}: {claim.measured} -> {claim.verdict}")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
