"""Figures of run histories: mean +- std over seeds against samples or seconds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

HEADLINE_METRICS = ("grad_norm", "F_gap", "outer_loss")


def headline_metric(history: pd.DataFrame) -> str:
    for name in HEADLINE_METRICS:
        if name in history.columns:
            return name
    raise ValueError(f"no known metric in the history columns {list(history.columns)}.")


def mean_std(history: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """Per evaluation step: mean of ``x`` and mean/std of ``y`` over seeds."""
    g = history.groupby("step")
    out = pd.DataFrame(
        {"mean": g[y].mean(), "std": g[y].std(ddof=0).fillna(0.0), "n": g[y].count()}
    )
    if x != "step":
        out[x] = g[x].mean()
    return out.reset_index()


def plot_history(
    histories: dict[str, pd.DataFrame],
    path: str | Path,
    *,
    metric: str | None = None,
    xs: tuple[str, ...] = ("samples", "seconds"),
    title: str = "",
    logy: bool = True,
) -> Path:
    """One panel per x-axis; one curve per label with a +-1 std band over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = next(iter(histories.values()))
    metric = metric or headline_metric(first)
    fig, axes = plt.subplots(1, len(xs), figsize=(5.2 * len(xs), 3.8), squeeze=False)
    for ax, x in zip(axes[0], xs, strict=True):
        # one x-axis per panel: fall back to steps only if no curve has this column (a run
        # that stopped at its first evaluation has samples = 0 and must not relabel the panel)
        has = [x in h.columns and h[x].max() > 0 for h in histories.values()]
        xcol = x if any(has) else "step"
        for label, hist in histories.items():
            if xcol not in hist.columns:
                continue
            stats = mean_std(hist, xcol, metric)
            ax.plot(stats[xcol], stats["mean"], label=label)
            lo = stats["mean"] - stats["std"]
            if logy:
                lo = np.maximum(lo, stats["mean"] * 1e-3)
            ax.fill_between(stats[xcol], lo, stats["mean"] + stats["std"], alpha=0.25)
            ax.set_xlabel(xcol)
        ax.set_ylabel(metric)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path, title)


#: the exact metrics a closed-form problem reports, shown side by side by ``plot_run``
RUN_METRICS = ("grad_norm", "x_err", "F_gap")


def plot_run(
    history: pd.DataFrame,
    path: str | Path,
    *,
    label: str,
    title: str = "",
    metrics: tuple[str, ...] = RUN_METRICS,
) -> Path:
    """The figure of ``bilevel run``: one panel per metric against samples (steps for a
    deterministic problem), the mean over seeds with a labelled +-1 std band.

    Shows those of ``metrics`` that the history has, else its headline metric.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in metrics if m in history.columns] or [headline_metric(history)]
    x = "samples" if "samples" in history.columns and history["samples"].max() > 0 else "step"
    n_seeds = history["seed"].nunique() if "seed" in history.columns else 1
    fig, axes = plt.subplots(1, len(shown), figsize=(4.6 * len(shown), 3.8), squeeze=False)
    for ax, metric in zip(axes[0], shown, strict=True):
        stats = mean_std(history, x, metric)
        if n_seeds > 1:
            ax.plot(stats[x], stats["mean"], marker=".", ms=3, label=f"{label}: mean")
            lo = np.maximum(stats["mean"] - stats["std"], stats["mean"] * 1e-3)
            band = f"mean ± std over {n_seeds} seeds"
            ax.fill_between(stats[x], lo, stats["mean"] + stats["std"], alpha=0.25, label=band)
        else:
            ax.plot(stats[x], stats["mean"], marker=".", ms=3, label=f"{label} (1 seed)")
        ax.set_xlabel(f"{x} (linear up to the first evaluation, log after)")
        ax.set_ylabel(metric)
        ax.set_yscale("log")
        first = stats[x][stats[x] > 0]
        if len(first):  # the fast start gets as much room as the slow end
            ax.set_xscale("symlog", linthresh=float(first.min()), linscale=1.0)
            ax.set_xlim(0, float(stats[x].max()) * 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path, title)


def _save(fig, path: str | Path, title: str) -> Path:
    """Title, layout, write the PNG and free the figure."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(
    final: pd.DataFrame, fields: list[str], metric: str, path: str | Path, title: str = ""
) -> Path:
    """The figure of ``bilevel sweep``: the final mean of ``metric`` over the grid.

    Two fields: a heat map (log10 colour, diverged points blank); one field: a line plot on
    log axes. ``final`` is :func:`bilevel.drivers.sweep.final_means`'s table.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(fields) not in (1, 2):
        raise ValueError(f"plot_sweep draws 1- or 2-field grids, got fields={fields}.")
    values = final[metric].to_numpy(float)
    values = np.where(np.isfinite(values) & (values > 0), values, np.nan)
    if len(fields) == 1:
        fig, ax = plt.subplots(figsize=(5, 3.8))
        ax.plot(final[fields[0]], values, marker="o")
        numeric = all(isinstance(v, int | float | np.number) for v in final[fields[0]])
        ax.set(yscale="log", xlabel=fields[0], ylabel=f"final mean {metric}")
        ax.set_xscale("log" if numeric else "linear")
        return _save(fig, path, title)
    table = final.assign(_v=values).pivot(index=fields[0], columns=fields[1], values="_v")
    fig, ax = plt.subplots(figsize=(5.5, 4.4))
    image = ax.imshow(np.log10(table.to_numpy(float)), origin="lower", cmap="viridis")
    ax.set_xticks(range(table.shape[1]), [_tick(v) for v in table.columns], rotation=45)
    ax.set_yticks(range(table.shape[0]), [_tick(v) for v in table.index])
    ax.set(xlabel=fields[1], ylabel=fields[0])
    fig.colorbar(image, ax=ax, label=f"log10 final mean {metric} (blank: diverged)")
    return _save(fig, path, title)


def _tick(value) -> str:
    return f"{value:g}" if isinstance(value, int | float | np.number) else str(value)
