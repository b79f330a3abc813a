"""Private: jaxpr rewrites that make the compiled steps faster on XLA:CPU (CPU only).

Not part of the public API: the drivers call :func:`applies` and :func:`rewrite` (one entry
point), configured by :class:`bilevel.drivers.cpu_rewrites.CpuRewrites`. ``docs/performance.md``
measures what each rewrite gains.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from bilevel.drivers._xla_cpu import wide_dots
from bilevel.drivers.cpu_rewrites import CpuRewrites

__all__ = ["applies", "rewrite", "compile_step"]


def applies(options: CpuRewrites, mesh=None) -> bool:
    """Whether a step program is rewritten: some rewrite on, the CPU backend, no device mesh."""
    return options.any and mesh is None and jax.default_backend() == "cpu"


def rewrite(fn: Callable, options: CpuRewrites) -> Callable:
    """``fn`` (a function of pytrees, traced under ``jax.jit``) with the rewrites ``options``
    names applied to its jaxpr. (Skeleton: the sub-rewrites still read their environment
    variables.)"""
    return wide_dots.keep_wide_dots(fn)


def compile_step(raw: Callable, options: CpuRewrites, args: tuple, mesh=None, **jit_kwargs):
    """``jax.jit(raw, **jit_kwargs).lower(*args).compile()``, with ``raw`` rewritten as
    ``options`` say where :func:`applies` (skeleton: no fallback on failure yet)."""
    fn = rewrite(raw, options) if applies(options, mesh) else raw
    return jax.jit(fn, **jit_kwargs).lower(*args).compile()
