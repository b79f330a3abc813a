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
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
