"""Which XLA:CPU rewrites of the compiled steps are on: ``bl.CpuRewrites``.

``bl.solve``, ``bl.sweep`` and ``bl.solve_online`` compile their step programs through the
private rewrites of :mod:`bilevel.drivers._xla_cpu` on the CPU backend (one device, no mesh):
speed-ups for XLA:CPU that leave every value unchanged up to floating-point summation order
(``docs/performance.md`` measures each). This frozen options object says which are on; it is
part of each compiled program's cache key, so switching one in a process compiles anew.
"""

from __future__ import annotations

import dataclasses

__all__ = ["CpuRewrites", "resolve"]


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

    @classmethod
    def default(cls) -> CpuRewrites:
        """The options ``bl.solve`` uses when given none (skeleton: all on)."""
        return cls()


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
