"""Data parallelism over a device mesh (``bl.solve(..., devices=k)`` or ``mesh=``).

The scheme is JAX's own SPMD data parallelism, nothing home-made: the problem (its data
included), the solver and the state live *replicated* on the mesh (``NamedSharding(mesh,
P())``), and every minibatch a solver draws (``sampling._gather``, i.e. ``Minibatches.outer(i)``
and ``.inner(i)``) is constrained with ``jax.lax.with_sharding_constraint`` to have its sample
axis split over all the mesh's axes jointly. XLA's SPMD partitioner (GSPMD: Xu et al.,
"GSPMD: General and Scalable Parallelization for ML Computation Graphs", 2021) then gathers
each device's rows locally, computes each device's part of the minibatch mean, and all-reduces
it: a batch-mean gradient over the mesh equals the one-device gradient up to the order of the
floating-point sum. The outputs are constrained to stay replicated, so every device (and every
process under ``jax.distributed``) holds the same iterates.

The mesh must be known while a program is traced, and the samplers should not have to carry
it: :func:`use_mesh` holds it in one context variable that ``run.py`` sets around compilation,
and :func:`shard_batch` (called in ``sampling._gather``) reads it; with no mesh it does nothing.
Full-batch oracles (``batch_size=None``) are not gathered, so their data stay replicated: every
device computes the whole full-batch oracle (correct, not parallel).

See ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PyTree = Any

__all__ = [
    "DATA_AXIS",
    "make_mesh",
    "use_mesh",
    "current_mesh",
    "shard_batch",
    "replicate",
    "shard_grid",
]

#: the axis name of the 1-D mesh that ``devices=k`` builds
DATA_AXIS = "data"

_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("bilevel_mesh", default=None)


def make_mesh(devices: int | None, mesh: Mesh | None, caller: str = "solve") -> Mesh | None:
    """The mesh a run shards its minibatches over, or ``None`` (no sharding).

    Args:
        devices: ``k`` builds a 1-D mesh named :data:`DATA_AXIS` over the first ``k`` of
            ``jax.devices()`` (the global devices: under ``jax.distributed`` they span every
            process).
        mesh: a user's ``jax.sharding.Mesh``; the batch is split over all its axes jointly.
        caller: the function named in error messages.

    Raises:
        ValueError: both given, ``devices`` not a positive int or more than JAX sees, a mesh
            that leaves out a process of a multi-process run.
    """
    if devices is not None and mesh is not None:
        raise ValueError(
            f"{caller}: give devices= or mesh=, not both (devices=k is a 1-D mesh over the "
            "first k devices; mesh= a jax.sharding.Mesh of your own)."
        )
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise ValueError(
                f"{caller}(mesh=...) must be a jax.sharding.Mesh, got {type(mesh).__name__}; "
                "or give devices=k for a 1-D mesh over k devices."
            )
        return _check_processes(mesh, caller)
    if devices is None:
        return None
    if isinstance(devices, bool) or not isinstance(devices, int | np.integer) or devices < 1:
        raise ValueError(f"{caller}(devices=...) must be a positive int, got {devices!r}.")
    available = jax.devices()
    if devices > len(available):
        platform = available[0].platform
        raise ValueError(
            f"{caller}(devices={devices}) asks for {devices} devices but JAX sees "
            f"{len(available)} ({platform}). On CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={devices} before importing jax "
            "(it makes that many host devices); across processes or hosts call "
            "jax.distributed.initialize(...) first; or ask for fewer devices."
        )
    return _check_processes(Mesh(np.array(available[:devices]), (DATA_AXIS,)), caller)


def _check_processes(mesh: Mesh, caller: str) -> Mesh:
    """Every process of a ``jax.distributed`` run runs the same program, so each must own a
    device of the mesh."""
    owners = {d.process_index for d in mesh.devices.flat}
    missing = sorted(set(range(jax.process_count())) - owners)
    if missing:
        raise ValueError(
            f"{caller}: the mesh's {mesh.size} devices leave out processes {missing} of this "
            f"{jax.process_count()}-process run; use devices=len(jax.devices()) or a mesh with "
            "a device of every process."
        )
    return mesh


def check_batch_size(batch_size: int | None, mesh: Mesh | None, caller: str = "solve") -> None:
    """A minibatch is split evenly over the mesh: ``batch_size`` must be a multiple of its
    size (``None``, full batches, stays replicated and is always fine)."""
    if mesh is None or batch_size is None or batch_size % mesh.size == 0:
        return
    k = mesh.size
    raise ValueError(
        f"{caller}: batch_size={batch_size} does not split over the mesh's {k} devices; use a "
        f"multiple of {k} (e.g. batch_size={max(k, batch_size // k * k)}) or fewer devices."
    )


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None) -> Iterator[None]:
    """Trace the programs inside this block with minibatches sharded over ``mesh``
    (``None``: unsharded)."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def current_mesh() -> Mesh | None:
    """The mesh set by the innermost :func:`use_mesh`, or ``None``."""
    return _MESH.get()


def batch_spec(mesh: Mesh) -> PartitionSpec:
    """The sample axis split over all of ``mesh``'s axes jointly, the rest replicated."""
    return PartitionSpec(tuple(mesh.axis_names))


def shard_batch(batch: PyTree) -> PyTree:
    """``batch`` (leaves with a leading sample axis) constrained to be split over the current
    mesh along that axis; unchanged when no mesh is set. Called on every gathered minibatch."""
    mesh = _MESH.get()
    if mesh is None or batch is None:
        return batch
    sharding = NamedSharding(mesh, batch_spec(mesh))

    def constrain(leaf):
        if leaf.ndim == 0 or leaf.shape[0] % mesh.size:
            raise ValueError(
                f"a minibatch of shape {leaf.shape} does not split over the mesh's {mesh.size} "
                f"devices; use a batch size that is a multiple of {mesh.size}."
            )
        return jax.lax.with_sharding_constraint(leaf, sharding)

    return jax.tree.map(constrain, batch)


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding of everything but the minibatches: a full copy on every device."""
    return NamedSharding(mesh, PartitionSpec())


def replicate(tree: PyTree, mesh: Mesh | None) -> PyTree:
    """``tree``'s array leaves placed replicated on ``mesh`` (unchanged when ``None``).

    Under ``jax.distributed`` every process passes the same host values (the same problem
    built from the same seed), and ``jax.device_put`` assembles the global arrays from them.
    """
    if mesh is None:
        return tree
    return jax.device_put(tree, replicated(mesh))


def shard_grid(tree: PyTree, mesh: Mesh | None, axes: Any = 0) -> PyTree:
    """``tree`` placed for ``bl.sweep(devices=...)``: leaves with a leading axis of grid points
    split along it over all of ``mesh``'s axes jointly, the others replicated (unchanged when
    ``mesh`` is ``None``).

    ``axes`` is a prefix of ``tree`` saying which subtrees carry the grid axis: 0 for all,
    ``None`` for a subtree without it (``run.grid_axes``: a sweep's PRNG key is shared by its
    points). Every grid point's program is independent of the others, so XLA's SPMD
    partitioner runs each device's points there without communication.
    """
    if mesh is None:
        return tree
    split, copy = NamedSharding(mesh, batch_spec(mesh)), replicated(mesh)

    def placement(axis, subtree):
        return jax.tree.map(lambda _: copy if axis is None else split, subtree)

    shardings = jax.tree.map(placement, axes, tree, is_leaf=lambda a: a is None)
    return jax.device_put(tree, shardings)


def is_main_process() -> bool:
    """Whether this is process 0 (the one that prints progress and writes checkpoints)."""
    return jax.process_index() == 0
