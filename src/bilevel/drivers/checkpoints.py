"""Checkpoints of ``bl.solve``: a fingerprint of the run, atomic writes, and the resume.

A checkpoint is one ``.npz`` file (read with ``allow_pickle=False``): the state's leaves, the
history rows, a JSON ``meta`` (step, solver seconds, counter totals, alive seeds, the run's
fingerprint, its CPU rewrite options and numerics: float width, JAX version) and a sha256 of
all of it (:mod:`bilevel.drivers.checkpoint_integrity`, which checks a file before it is taken
up). A run resumes only from a checkpoint with its own fingerprint (:func:`signature`), so a
resumed run ends bit-identical to an uninterrupted one. A write goes to a temporary file first
(:data:`TEMP_PREFIX`); one left by a killed writer is removed by the next run
(:func:`remove_partial_writes`); a write that fails (a full disk, a read-only directory) raises
:class:`~bilevel.drivers.writes.WriteError` naming the file, and leaves the previous checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core import sharding as parallel
from bilevel.core.problem import BilevelProblem, users_function
from bilevel.drivers import checkpoint_integrity as integrity
from bilevel.drivers.cpu_rewrites import CpuRewrites
from bilevel.drivers.history import History
from bilevel.drivers.writes import WriteError
from bilevel.solvers.base import Solver

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_VERSION",
    "Checkpointer",
    "Resume",
    "signature",
    "save_checkpoint",
    "load_checkpoint",
    "remove_partial_writes",
    "TEMP_PREFIX",
]

CHECKPOINT_FILE = "checkpoint.npz"
# 2: solver states carry OuterState (direction_norm); 3: a content hash, the numerics
CHECKPOINT_VERSION = 3
#: the temporary files of :func:`save_checkpoint`: ``TEMP_PREFIX`` + 8 characters + ``.npz``
TEMP_PREFIX = ".checkpoint-"
_TEMP_NAME = re.compile(re.escape(TEMP_PREFIX) + r"[a-z0-9_]{8}\.npz")


def _strip_addresses(text: str) -> str:
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _closures(value, depth: int = 0) -> str:
    """The values the functions in ``value`` (a solver field: a schedule, an optax
    transformation, a tuple of them; or a problem's function) closed over, recursively, as text
    without memory addresses ("" if none)."""
    if depth > 4:  # a closure over itself, or a deep chain of schedules: enough to tell apart
        return ""
    if isinstance(value, tuple):
        return "".join(_closures(v, depth + 1) for v in value)
    if isinstance(value, np.ndarray | jax.Array):  # a problem's data or matrices: their bytes
        return _array_digest(value)
    if not callable(value):
        return ""
    parts = []
    for cell in getattr(value, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        parts.append(_closures(content, depth + 1) or _strip_addresses(repr(content)))
    return f"({';'.join(parts)})" if parts else ""


def _array_digest(value) -> str:
    """Shape, dtype and a hash of the bytes of an array (every 1/4096th row above 16 MB)."""
    a = np.ascontiguousarray(np.asarray(value))
    data = a.tobytes() if a.nbytes <= 1 << 24 else a[:: max(1, a.shape[0] // 4096)].tobytes()
    return f"{a.shape}{a.dtype}{hashlib.sha256(data).hexdigest()}"


def signature(
    problem: BilevelProblem,
    solver: Solver,
    seeds,
    batched: bool,
    eval_every: int,
    init=None,
    cpu_rewrites: CpuRewrites | None = None,
) -> str:
    """A fingerprint of everything that determines the trajectory (not ``steps``).

    ``batched``: whether the run was given ``seeds=`` (its results keep the seed axis);
    ``cpu_rewrites``: the rewrite options its step programs were compiled through (they move
    the floating-point rounding), as the float width and the JAX version do
    (:func:`~bilevel.drivers.checkpoint_integrity.numerics`).
    """
    h = hashlib.sha256()
    # functions (schedules, an optax outer optimiser) print with their memory address, which
    # differs in every process: a resumed run must not look like another run
    h.update(_strip_addresses(repr(solver)).encode())
    # ... which also hides what a function closed over: optax.trace(decay=0.5) and (decay=0.9),
    # or two exponential decays, print alike; their closures tell them apart
    for fld in dataclasses.fields(solver):
        h.update(_closures(getattr(solver, fld.name)).encode())
    h.update(repr((problem.name, seeds, batched, eval_every, CHECKPOINT_VERSION)).encode())
    if getattr(problem, "batch_chunks", 1) > 1:  # (absent before the option: old prints hold)
        h.update(f"batch_chunks {problem.batch_chunks}".encode())
    if cpu_rewrites is not None:
        h.update(repr(cpu_rewrites).encode())
    h.update(repr(sorted(integrity.numerics().items())).encode())
    _problem_digest(h, problem, init)
    return h.hexdigest()


def _problem_digest(h, problem: BilevelProblem, init) -> None:
    """Add the problem's structure, functions (code and closures) and data to ``h``."""
    children, _ = problem.tree_flatten()
    leaves, treedef = jax.tree.flatten(children)
    h.update(str(treedef).encode())  # structure only: function reprs hold memory addresses
    if any(part is not None for part in problem.model_parts):  # a model's functions, ...
        h.update(_strip_addresses(repr(problem.model_parts)).encode())
    for fn in (problem.outer, problem.inner, problem.metrics, init):
        fn = users_function(fn)
        code = getattr(fn, "__code__", None)
        h.update(
            repr((getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))).encode()
        )
        h.update(code.co_code if code is not None else b"")
        h.update(_closures(fn).encode())  # the constants a problem's functions closed over
    for leaf in leaves:
        h.update(_array_digest(leaf).encode())


def save_checkpoint(directory: Path, state, meta: dict, history: list[dict]) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then ``os.replace``;
    the file carries a hash of its content (:func:`checkpoint_integrity.content_digest`).

    Raises:
        WriteError: an ``OSError`` (a full disk, a read-only directory), naming the checkpoint
            file and keeping the errno; the previous checkpoint is left as it was and the
            temporary file removed.
    """
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state)]
    arrays = {f"leaf_{i}": a for i, a in enumerate(leaves)}
    meta_json, history_json = json.dumps(meta), json.dumps(history)
    arrays["meta"] = np.array(meta_json)
    arrays["history"] = np.array(history_json)
    arrays["digest"] = np.array(integrity.content_digest(leaves, meta_json, history_json))
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=".npz", dir=directory)
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / CHECKPOINT_FILE)
    except OSError as err:
        raise WriteError(directory / CHECKPOINT_FILE, err) from err
    finally:
        if tmp is not None and os.path.exists(tmp):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def remove_partial_writes(directory: Path) -> list[str]:
    """Remove the temporary files :func:`save_checkpoint` left in ``directory`` when it was
    killed mid-write (only its own name pattern); the names removed. Call it only while owning
    the directory (:class:`bilevel.drivers.run_lock.RunLock`): a live writer's file is not
    partial."""
    removed = []
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False) and _TEMP_NAME.fullmatch(entry.name):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            removed.append(entry.name)
    return removed


def load_checkpoint(directory: Path, state_template, signature: str, cpu_rewrites: dict):
    """``(state, meta, history rows)`` of the checkpoint in ``directory`` (``None`` if none);
    refused (ValueError) when it is corrupt (:class:`checkpoint_integrity.CorruptCheckpoint`),
    was written by an older version, by another run, under other numerics, or its state does
    not fit the template."""
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    contents = integrity.read(path)
    meta, history = integrity.verify(path, contents)
    integrity.check_numerics(directory, meta.get("numerics"), integrity.numerics())
    _check_same_run(directory, meta, signature, cpu_rewrites)
    template, treedef = jax.tree.flatten(state_template)
    leaves = contents.leaves
    fits = len(leaves) == len(template) and all(
        got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype
        for got, want in zip(leaves, template, strict=False)
    )
    if not fits:
        raise ValueError(f"the checkpoint in {directory} does not match the solver state.")
    integrity.check_consistent(path, jax.tree.unflatten(treedef, leaves), meta, history)
    state = jax.tree.unflatten(treedef, [jnp.asarray(a) for a in leaves])
    return state, meta, history


def _check_same_run(directory: Path, meta: dict, signature: str, cpu_rewrites: dict) -> None:
    saved = meta.get("cpu_rewrites")
    if saved is not None and saved != cpu_rewrites:
        raise ValueError(
            f"the checkpoint in {directory} was written under other CPU rewrite options "
            f"(cpu_rewrites=bl.CpuRewrites(**{saved})) than this run's "
            f"(bl.CpuRewrites(**{cpu_rewrites})); they change the floating-point rounding, so "
            "the resumed run would not continue it exactly. Resume with the same cpu_rewrites= "
            "(and BILEVEL_* environment), or use another checkpoint directory."
        )
    if meta.get("signature") != signature:
        raise ValueError(
            f"the checkpoint in {directory} was written by a different run (solver, "
            "problem, seeds or eval_every differ, or an older bilevel version; a run of other "
            "steps is another run where a setting follows the horizon: a tuned "
            "lr_outer='auto', F2SA's k0='auto', IBCG's horizon, so give those as numbers to "
            "extend a run); use another checkpoint directory or delete it."
        )


class Resume(NamedTuple):
    """Where a checkpoint lets a run take up: its state, steps done and solver seconds."""

    state: object
    step: int
    seconds: float


class Checkpointer:
    """Atomic saves at most every ``interval`` seconds (always when forced), and the resume.

    The engine's states carry a seed axis; a run of one ``seed=`` saves them without it (the
    file holds what the run returns, ``seed_axis=False``) and gets it back on loading.
    """

    def __init__(
        self,
        directory: Path,
        signature: str,
        interval: float,
        seed_axis: bool = True,
        cpu_rewrites: CpuRewrites | None = None,
    ):
        self.directory = directory
        self.signature = signature
        self.interval = interval
        self.seed_axis = seed_axis
        self.cpu_rewrites = dataclasses.asdict(cpu_rewrites or CpuRewrites.none())
        self.numerics = integrity.numerics()
        self.last_save = time.monotonic()

    def load(self, state_template, history: History, steps: int) -> Resume | None:
        """The checkpoint to resume from (the history restored), or ``None`` when none."""
        template = self._on_file(state_template)
        loaded = load_checkpoint(self.directory, template, self.signature, self.cpu_rewrites)
        if loaded is None:
            return None
        state, meta, rows = loaded
        done = int(meta["step"])
        if done > steps:
            raise ValueError(
                f"the checkpoint in {self.directory} is at step {done}, beyond steps={steps}; "
                f"ask for at least {done} steps or use another checkpoint directory."
            )
        history.restore(meta, rows)
        if not self.seed_axis:
            state = jax.tree.map(lambda a: a[None], state)
        return Resume(state, done, float(meta["seconds"]))

    def save(self, state, history: History, step: int, seconds: float, force: bool) -> None:
        """Write a checkpoint if forced or ``interval`` seconds passed (process 0 only); a
        failed write raises :class:`~bilevel.drivers.writes.WriteError` (the previous
        checkpoint stays) carrying ``state``."""
        if not parallel.is_main_process():  # one writer per run
            return
        if not force and time.monotonic() - self.last_save < self.interval:
            return
        meta = {"signature": self.signature, "step": step, "seconds": seconds}
        meta |= history.meta() | {"cpu_rewrites": self.cpu_rewrites, "numerics": self.numerics}
        on_file = jax.tree.map(np.asarray, self._on_file(state))
        try:  # what a load would refuse is not written (a second Ctrl-C amid the bookkeeping)
            integrity.check_consistent(
                self.directory / CHECKPOINT_FILE, on_file, meta, history.rows
            )
        except integrity.CorruptCheckpoint as err:
            warnings.warn(
                f"not writing the checkpoint of step {step} ({err.reason}); the previous one "
                "stays.",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        try:
            save_checkpoint(self.directory, on_file, meta, history.rows)
        except WriteError as err:
            err.state = state  # the run's, so that ``solve`` can return the steps done with it
            raise
        self.last_save = time.monotonic()

    def _on_file(self, state):
        # numpy, not a jitted slice: only process 0 writes, and a jitted op on a global array
        # would wait for the other processes
        return state if self.seed_axis else jax.tree.map(lambda a: np.asarray(a)[0], state)
