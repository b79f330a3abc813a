"""Which XLA:CPU rewrites of the compiled steps are on: ``bl.CpuRewrites``.

``bl.solve``, ``bl.sweep`` and ``bl.solve_online`` compile their step programs through the
private rewrites of :mod:`bilevel.drivers._xla_cpu` on the CPU backend (one device, no mesh):
speed-ups for XLA:CPU that leave every value unchanged up to floating-point summation order
(``docs/performance.md`` measures each). This frozen options object says which are on; it is
part of each compiled program's cache key, so switching one in a process compiles anew.

The rewrites read JAX's jaxprs below its documented API, so they are on by default only for the
JAX versions they were tested with (:data:`TESTED_JAX`); outside that window
:meth:`CpuRewrites.default` turns them all off and warns once. Passing
``cpu_rewrites=bl.CpuRewrites()`` turns them on whatever the version, and the environment sets
the defaults (read once per process): ``BILEVEL_WIDE_DOTS=0`` turns every rewrite off,
``BILEVEL_WIDE_DOTS=1`` turns them on outside the window, and ``BILEVEL_MERGE_DOTS``,
``BILEVEL_CARRY_LAYOUT``, ``BILEVEL_SMALL_DOTS``, ``BILEVEL_UNROLLED_KEYS`` set to ``0`` or
``1`` turn one off or on.

A rewrite that fails on a program is dropped for that program and reported once per process
with a :class:`CpuRewriteWarning` (:func:`warn_once`); the program then runs without it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import warnings

import jax

__all__ = [
    "CpuRewrites",
    "CpuRewriteWarning",
    "TESTED_JAX",
    "in_tested_window",
    "resolve",
    "warn_once",
]

#: the JAX versions the rewrites are on by default for: from the first (inclusive) up to the
#: second (exclusive), compared on their numeric release parts (tested on 0.10.2)
TESTED_JAX = ("0.10.0", "0.11")
#: the JAX version the window is checked against (a module attribute, so tests can move it)
JAX_VERSION = jax.__version__

#: the environment variable that sets each rewrite's default (``BILEVEL_WIDE_DOTS``, the name
#: of the first rewrite, historically switches the whole pass)
ENVIRONMENT = {
    "wide_dots": "BILEVEL_WIDE_DOTS",
    "merge_dots": "BILEVEL_MERGE_DOTS",
    "carry_layout": "BILEVEL_CARRY_LAYOUT",
    "small_dots": "BILEVEL_SMALL_DOTS",
    "unrolled_keys": "BILEVEL_UNROLLED_KEYS",
}


class CpuRewriteWarning(RuntimeWarning):
    """A CPU rewrite was left off: the program runs as traced (or without that one rewrite),
    with the same values, possibly slower.

    The rewrites are speed-ups, so a warning filter that turns warnings into errors (such as
    ``-W error``) does not make them fail a program: :func:`warn_once` still goes on with the
    fallback. ``warnings.simplefilter("ignore", CpuRewriteWarning)`` silences them.
    """


@dataclasses.dataclass(frozen=True)
class CpuRewrites:
    """Which of the XLA:CPU rewrites are on (all by default, inside the tested JAX window).

    Attributes:
        wide_dots: a barrier after each wide, transposed rank-2 product (a linear layer's
            weight gradient keeps XLA:CPU's fast product shape).
        merge_dots: independent products that share an operand run as one.
        carry_layout: loops carry narrow weight matrices transposed.
        small_dots: products of up to 1,024 multiply-adds written as a multiply and a sum.
        unrolled_keys: PRNG key splits and random bits written out as fused kernels.
    """

    wide_dots: bool = True
    merge_dots: bool = True
    carry_layout: bool = True
    small_dots: bool = True
    unrolled_keys: bool = True

    @classmethod
    def none(cls) -> CpuRewrites:
        """Every rewrite off: the programs are compiled as traced."""
        return cls(False, False, False, False, False)

    @property
    def any(self) -> bool:
        """Whether at least one rewrite is on."""
        return any(dataclasses.astuple(self))

    def without(self, name: str) -> CpuRewrites:
        """These options with the rewrite ``name`` (a field name) off."""
        return dataclasses.replace(self, **{name: False})

    @classmethod
    def default(cls) -> CpuRewrites:
        """The options ``bl.solve`` uses when given none: all on inside the tested JAX window
        (:data:`TESTED_JAX`), all off outside it (with one :class:`CpuRewriteWarning`), and
        either as the environment variables say (module docstring). Computed once per
        process."""
        return _defaults()


def _release(version: str) -> tuple[int, ...]:
    """The numeric release part of a version: ``"0.10.2rc1"`` -> ``(0, 10, 2)``."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def in_tested_window(version: str | None = None) -> bool:
    """Whether ``version`` (default :data:`JAX_VERSION`) is in :data:`TESTED_JAX`."""
    release = _release(JAX_VERSION if version is None else version)
    return _release(TESTED_JAX[0]) <= release < _release(TESTED_JAX[1])


@functools.cache
def _defaults() -> CpuRewrites:
    """:meth:`CpuRewrites.default`, cached: the environment and the version are read once."""
    switches = {name: os.environ.get(variable) for name, variable in ENVIRONMENT.items()}
    if switches["wide_dots"] == "0":
        return CpuRewrites.none()
    on = in_tested_window() or switches["wide_dots"] == "1"
    # on another backend the rewrites never apply (`_xla_cpu.applies`): nothing to warn about
    quiet = any(value == "1" for value in switches.values()) or not _on_cpu()
    if not on and not quiet:
        low, high = TESTED_JAX
        warn_once(
            "jax-version",
            f"The XLA:CPU rewrites of bilevel are off: JAX {JAX_VERSION} is outside the versions "
            f"they were tested with ({low} up to {high}, exclusive). Values are unchanged; the "
            "compiled steps may be slower. To turn them on, pass "
            "cpu_rewrites=bl.CpuRewrites() to bl.solve, bl.sweep or bl.solve_online, or set "
            "BILEVEL_WIDE_DOTS=1 in the environment.",
        )
    return CpuRewrites(
        **{name: value == "1" or (on and value != "0") for name, value in switches.items()}
    )


def _on_cpu() -> bool:
    """Whether JAX's default backend is the CPU (False when it cannot be read)."""
    try:
        return jax.default_backend() == "cpu"
    except RuntimeError:
        return False


#: the keys :func:`warn_once` has warned about in this process
_WARNED: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """Issue ``message`` as a :class:`CpuRewriteWarning`, once per process for each ``key``.

    A filter that makes the warning an error does not stop the caller's fallback: the
    rewrites are speed-ups, never a reason for a program to fail (the error is dropped)."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    try:
        warnings.warn(message, CpuRewriteWarning, stacklevel=3)
    except CpuRewriteWarning:
        pass


def resolve(value) -> CpuRewrites:
    """``cpu_rewrites=`` of the drivers as options: ``None`` or ``True`` the defaults,
    ``False`` none, a :class:`CpuRewrites` itself."""
    if value is None or value is True:
        return CpuRewrites.default()
    if value is False:
        return CpuRewrites.none()
    if isinstance(value, CpuRewrites):
        return value
    raise TypeError(
        f"cpu_rewrites must be a bl.CpuRewrites, True, False or None, got {type(value).__name__}."
    )
