"""Private: jaxpr rewrites that make the compiled steps faster on XLA:CPU (CPU only).

Not part of the public API: the drivers call :func:`compile_step` (or :func:`applies` and
:func:`rewrite`), configured by :class:`bilevel.drivers.cpu_rewrites.CpuRewrites`.
``docs/performance.md`` measures what each rewrite gains. The modules: ``evaluate`` (the
re-tracing evaluator the rewrites plug into), ``wide_dots``, ``dot_merge``, ``carry_layout``
(with ``carry_loops``), ``small_dots``, ``unrolled_keys`` (one rewrite each).

Every step of the way falls back rather than fail: a rewrite that raises is dropped for that
program (the others still apply), a program the evaluator cannot re-trace runs as traced, and
:func:`compile_step` compiles the original program where the rewritten one fails to lower or
compile, or has other output shapes or dtypes. Each fallback is reported once per process with
a :class:`~bilevel.drivers.cpu_rewrites.CpuRewriteWarning`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from jax.extend import core as jcore

from bilevel.drivers._xla_cpu import evaluate
from bilevel.drivers.cpu_rewrites import CpuRewrites, warn_once

__all__ = ["applies", "rewrite", "compile_step"]


def applies(options: CpuRewrites, mesh=None) -> bool:
    """Whether a step program is rewritten: some rewrite on, the CPU backend, no device mesh."""
    return options.any and mesh is None and jax.default_backend() == "cpu"


def rewrite(fn: Callable, options: CpuRewrites) -> Callable:
    """``fn`` (a function of pytrees, traced under ``jax.jit``) with the rewrites ``options``
    names applied to its jaxpr.

    The returned function traces ``fn`` to a jaxpr at each call and evaluates the rewritten
    jaxpr (:func:`evaluate.rewrite_jaxpr`). A rewrite that raises is turned off for this
    program and the others applied without it; if the evaluator itself fails, ``fn`` is
    evaluated unchanged. Each is warned about once per process.
    """

    def rewritten(*args):
        flat, treedef = jax.tree.flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *leaves: fn(*jax.tree.unflatten(treedef, leaves)), return_shape=True
        )(*flat)
        new = _rewrite_each_or_none(closed, options)
        if new is None:
            return fn(*args)
        outs = jcore.jaxpr_as_fun(new)(*flat)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return rewritten


def _rewrite_each_or_none(closed, options: CpuRewrites):
    """``closed`` rewritten with ``options`` less the rewrites that raise on it (each warned
    about once); None where no rewrite is left or the evaluator fails."""
    while options.any:
        try:
            return evaluate.rewrite_jaxpr(closed, options)
        except evaluate.RewriteError as err:
            if err.name is None:
                _warn_unchanged(err.cause)
                return None
            warn_once(
                f"rewrite:{err.name}",
                f"The XLA:CPU rewrite {err.name!r} failed on a program and is left off for it "
                f"(the other rewrites still apply; values are unchanged): {_reason(err.cause)}. "
                f"cpu_rewrites=bl.CpuRewrites({err.name}=False) turns it off.",
            )
            options = options.without(err.name)
        except Exception as err:  # noqa: BLE001  (a speed-up must never break a program)
            _warn_unchanged(err)
            return None
    return None


def _warn_unchanged(cause: BaseException) -> None:
    warn_once(
        "evaluator",
        "The XLA:CPU rewrites could not re-trace a program, which is compiled as traced "
        f"(values are unchanged): {_reason(cause)}.",
    )


def _reason(cause: BaseException, limit: int = 300) -> str:
    """An exception in one line of at most ``limit`` characters."""
    text = " ".join(f"{type(cause).__name__}: {cause}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compile_step(raw: Callable, options: CpuRewrites, args: tuple, mesh=None, **jit_kwargs):
    """``jax.jit(raw, **jit_kwargs).lower(*args).compile()``, with ``raw`` rewritten as
    ``options`` say where :func:`applies`.

    The rewritten program is compiled only if it lowers and compiles and its outputs have
    the shapes and dtypes of ``raw``'s (``jax.eval_shape``); otherwise ``raw`` is compiled
    as it is, with one warning per process.
    """
    if applies(options, mesh):
        compiled = _compile_rewritten(raw, options, args, jit_kwargs)
        if compiled is not None:
            return compiled
    return jax.jit(raw, **jit_kwargs).lower(*args).compile()


def _compile_rewritten(raw: Callable, options: CpuRewrites, args: tuple, jit_kwargs: dict):
    """The rewritten program compiled, or None (warned about) where that fails or its outputs
    differ in type from ``raw``'s."""
    try:
        lowered = jax.jit(rewrite(raw, options), **jit_kwargs).lower(*args)
    except Exception as err:  # noqa: BLE001  (a speed-up must never break a program)
        _warn_compile(err)
        return None
    expected = jax.eval_shape(raw, *args)
    if not _same_types(lowered.out_info, expected):
        warn_once(
            "shapes",
            "A program rewritten by the XLA:CPU rewrites changed its output shapes or dtypes; "
            "the original program is compiled instead (values are unchanged).",
        )
        return None
    try:
        return lowered.compile()
    except Exception as err:  # noqa: BLE001
        _warn_compile(err)
        return None


def _warn_compile(cause: BaseException) -> None:
    warn_once(
        "compile",
        "A program rewritten by the XLA:CPU rewrites failed to lower or compile; the original "
        f"program is compiled instead (values are unchanged): {_reason(cause)}.",
    )


def _same_types(got, expected) -> bool:
    """Whether two pytrees of ``ShapeDtypeStruct`` have one structure, shapes and dtypes."""
    if jax.tree.structure(got) != jax.tree.structure(expected):
        return False
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
    return all(a.shape == b.shape and a.dtype == b.dtype for a, b in pairs)
