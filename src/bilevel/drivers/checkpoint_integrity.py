"""What a checkpoint must be to be taken up: intact, consistent, and of the same numerics.

A checkpoint stores a sha256 of its content (:func:`content_digest`: every state array with its
name, dtype and shape, the ``meta`` JSON with the step, and the history rows). On loading,
:func:`read` turns any unreadable file (empty, not a zip archive, truncated, a damaged member)
into :class:`CorruptCheckpoint`, :func:`verify` refuses a file whose content no longer matches
its hash (an edit, a partial write) and :func:`check_consistent` one whose step disagrees with
the state's iteration count or with the history, or whose state is not finite (a run never
saves a non-finite state: diverged seeds keep their last finite one). Each refusal is one line,
``checkpoint PATH is corrupt (REASON); delete it or use another directory``.

:func:`numerics` is what, besides the run's own arguments, decides the bits of a resumed run:
the float width (``jax_enable_x64``) and the JAX version; :func:`check_numerics` names what
differs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

__all__ = [
    "CorruptCheckpoint",
    "Contents",
    "content_digest",
    "read",
    "verify",
    "check_consistent",
    "numerics",
    "check_numerics",
]


class CorruptCheckpoint(ValueError):
    """A checkpoint file that cannot be trusted (a ``ValueError``: one line on the command
    line)."""

    def __init__(self, path: Path, reason: str):
        super().__init__(
            f"checkpoint {path} is corrupt ({reason}); delete it or use another directory"
        )
        self.path = path
        self.reason = reason


class Contents(NamedTuple):
    """A checkpoint file as read, before it is trusted."""

    leaves: list[np.ndarray]  # leaf_0, leaf_1, ...
    meta_json: str
    history_json: str
    digest: str | None  # None: written before checkpoints carried one


def content_digest(leaves: list[np.ndarray], meta_json: str, history_json: str) -> str:
    """sha256 over the state arrays (name, dtype, shape, bytes), the meta and the history."""
    h = hashlib.sha256()
    for i, leaf in enumerate(leaves):
        a = np.ascontiguousarray(leaf)
        h.update(f"leaf_{i}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    h.update(b"meta|" + meta_json.encode())
    h.update(b"history|" + history_json.encode())
    return h.hexdigest()


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a .npz is a zip archive


def read(path: Path) -> Contents:
    """The entries of the checkpoint file ``path``; :class:`CorruptCheckpoint` when it cannot
    be read as one (never numpy's own errors, such as its ``allow_pickle`` one for a file that
    is not an archive)."""
    try:
        with open(path, "rb") as fh:  # numpy leaves its own file open on a damaged archive
            return _entries(path, fh)
    except OSError as err:
        raise CorruptCheckpoint(path, f"unreadable: {err.strerror or err}") from err


def _entries(path: Path, fh) -> Contents:
    head = fh.read(4)
    if not head:
        raise CorruptCheckpoint(path, "the file is empty")
    if head not in _ZIP_MAGIC:
        raise CorruptCheckpoint(path, "not a .npz archive")
    fh.seek(0)
    try:
        with np.load(fh, allow_pickle=False) as npz:
            names = set(npz.files)
            if not {"meta", "history"} <= names:
                raise CorruptCheckpoint(path, "no meta or history entry")
            count = sum(1 for n in names if n.startswith("leaf_"))
            leaves = [npz[f"leaf_{i}"] for i in range(count)]
            digest = str(npz["digest"]) if "digest" in names else None
            return Contents(leaves, str(npz["meta"]), str(npz["history"]), digest)
    except CorruptCheckpoint:
        raise
    except Exception as err:  # zipfile.BadZipFile, EOFError, KeyError, zlib.error, OSError ...
        detail = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
        reason = f"truncated or damaged: {type(err).__name__}" + (f": {detail}" if detail else "")
        raise CorruptCheckpoint(path, reason) from err


def verify(path: Path, contents: Contents) -> tuple[dict, list]:
    """``(meta, history rows)`` of a file whose content matches its hash; a file without one
    was written by an older version (ValueError)."""
    if contents.digest is None:
        raise ValueError(
            f"checkpoint {path} was written by an older version of bilevel (it has no content "
            "hash); delete it to start afresh"
        )
    if contents.digest != content_digest(
        contents.leaves, contents.meta_json, contents.history_json
    ):
        raise CorruptCheckpoint(path, "its content does not match its hash: edited or damaged")
    try:
        meta, rows = json.loads(contents.meta_json), json.loads(contents.history_json)
    except ValueError as err:
        raise CorruptCheckpoint(path, "its meta or history is not JSON") from err
    if not isinstance(meta, dict) or not isinstance(rows, list):
        raise CorruptCheckpoint(path, "its meta or history has the wrong form")
    return meta, rows


def check_consistent(path: Path, state, meta: dict, rows: list) -> None:
    """Refuse a checkpoint whose step disagrees with the state or the history, or whose state
    is not finite. ``state`` as on file: with a seed axis, or without one (one seed)."""
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CorruptCheckpoint(path, f"its step {step!r} is not a count of steps")
    alive = np.atleast_1d(np.asarray(meta.get("alive", []), bool))
    k = getattr(state, "k", None)  # every solver's iteration count
    if k is not None:
        k = np.atleast_1d(np.asarray(k))
        if k.shape != alive.shape or (k > step).any() or (k[alive] != step).any():
            raise CorruptCheckpoint(
                path, f"its step {step} disagrees with the state's iteration count {k.tolist()}"
            )
    last = max((row.get("step", -1) for row in rows if isinstance(row, dict)), default=None)
    if (last is not None and last > step) or (alive.any() and last != step):
        raise CorruptCheckpoint(
            path, f"its step {step} disagrees with the history, which ends at step {last}"
        )
    for where, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        a = np.asarray(leaf)
        if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
            name = jax.tree_util.keystr(where) or "the state"
            raise CorruptCheckpoint(path, f"NaN or inf in the state ({name})")


def numerics() -> dict:
    """What decides the bits of a run besides its arguments: the float width and the JAX
    version (its compiler rounds differently from one version to another)."""
    import jaxlib

    x64 = bool(jax.config.read("jax_enable_x64"))
    return {
        "float": "float64" if x64 else "float32",
        "jax": jax.__version__,
        "jaxlib": getattr(jaxlib, "__version__", "?"),
    }


def _float_setting(name: str) -> str:
    if name == "float64":
        return "float64 (jax_enable_x64 on: JAX_ENABLE_X64 set)"
    return f"{name} (jax_enable_x64 off: JAX_ENABLE_X64 unset)"


def check_numerics(directory: Path, saved: dict | None, current: dict) -> None:
    """Refuse (ValueError) a checkpoint written under other numerics, naming what differs."""
    if saved is None or saved == current:
        return
    if saved.get("float") != current["float"]:
        then, now = _float_setting(str(saved.get("float"))), _float_setting(current["float"])
    else:
        then = f"JAX {saved.get('jax')} (jaxlib {saved.get('jaxlib')})"
        now = f"JAX {current['jax']} (jaxlib {current['jaxlib']})"
    raise ValueError(
        f"the checkpoint in {directory} was written with {then}; this run uses {now}, which "
        "rounds differently, so the resumed run would not continue it exactly. Resume with "
        "the same setting, or use another checkpoint directory."
    )
