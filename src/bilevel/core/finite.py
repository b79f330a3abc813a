"""The value check of a problem's data and starting point: every entry finite, and small
enough that its square is finite too.

A value whose square overflows its dtype (``|v| > sqrt(finfo.max)``: 1.8e19 in float32,
1.3e154 in float64) makes every squared loss, norm and Gram matrix of the data ``inf``, so a
run on it fails later with an unrelated error (the automatic step-size probe's
``LinAlgError``); it is refused at construction like NaN and inf, naming the leaf, the first
offending row (or index) and its value.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["check_values", "square_limit"]

#: entries per pass of the scan: a bounded temporary over large data
_CHUNK = 1 << 22


def square_limit(dtype) -> float:
    """The largest magnitude whose square is finite in ``dtype`` (as JAX will compute in it)."""
    return float(np.sqrt(np.float64(jnp.finfo(jax.dtypes.canonicalize_dtype(dtype)).max)))


def _scan(a: np.ndarray, limit: float) -> tuple[int, int, int | None, int | None]:
    """``(non-finite count, too-large count, first non-finite flat index, first too-large
    flat index)`` of ``a``, in chunks."""
    flat = a.reshape(-1)
    counts, firsts = [0, 0], [None, None]
    for start in range(0, flat.size, _CHUNK):
        part = flat[start : start + _CHUNK]
        if part.dtype.kind not in "fc":  # bfloat16 and other ml_dtypes: numpy's own float
            part = part.astype(np.float32)
        finite = np.isfinite(part)
        with np.errstate(invalid="ignore", over="ignore"):
            large = finite & (np.abs(part) > limit)
        for i, mask in enumerate((~finite, large)):
            hits = np.flatnonzero(mask)
            counts[i] += hits.size
            if hits.size and firsts[i] is None:
                firsts[i] = start + int(hits[0])
    return counts[0], counts[1], firsts[0], firsts[1]


def _where(a: np.ndarray, flat: int, axes: Sequence[str]) -> str:
    """``the first in row 17 (index (17, 3), value 3e+38)``: the leading ``axes`` named."""
    index = tuple(int(i) for i in np.unravel_index(flat, a.shape))
    named = ", ".join(f"{name} {i}" for name, i in zip(axes, index, strict=False))
    value = a.reshape(-1)[flat]
    value = str(complex(value)) if np.iscomplexobj(value) else f"{float(value):.6g}"
    if named:
        return f"the first in {named} (index {index}, value {value})"
    return f"the first at index {index} (value {value})" if index else f"its value {value}"


def check_values(tree, arg: str, owner: str, axes: Sequence[str] = (), label: bool = True) -> None:
    """Refuse (ValueError) a floating leaf of ``tree`` holding NaN or inf, or a finite value
    whose square overflows the dtype JAX computes it in, naming ``owner(arg=...)``, the leaf
    (``label``), how many, and the first one: its position on the leading ``axes`` (``("row",)``
    for data with a sample axis; none: its index) and its value."""
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        a = np.asarray(leaf)
        if not jnp.issubdtype(a.dtype, jnp.inexact) or a.size == 0:
            continue
        limit = square_limit(a.dtype)
        bad, large, first_bad, first_large = _scan(a, limit)
        if not bad and not large:
            continue
        leaf_name = jax.tree_util.keystr(path)
        where = f" in leaf {leaf_name or '(root)'}" if label or leaf_name else ""
        if bad:
            raise ValueError(
                f"{owner}({arg}=...) has {bad} non-finite value(s) (NaN or inf){where}, "
                f"{_where(a, first_bad, axes)}; every entry must be finite."
            )
        dtype = jax.dtypes.canonicalize_dtype(a.dtype)
        raise ValueError(
            f"{owner}({arg}=...) has {large} value(s) too large for {dtype} (|v| > "
            f"{limit:.3g}: the square overflows){where}, {_where(a, first_large, axes)}; every "
            "entry and its square must be finite: rescale them."
        )
