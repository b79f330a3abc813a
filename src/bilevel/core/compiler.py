"""Compiler options every compiled program of the package takes: a guard against a miscompile.

jaxlib 0.10.2 miscompiles some float64 multiply-reduce fusions on XLA:CPU (its YNNPACK fusions;
jax-ml/jax#39103): ``jax.jit(jax.jacfwd(...))`` of the cross derivative ``d^2 g / dx dy`` of
the stochastic ``bl.problems.quadratic`` (a mean over 500 rows or more) came out 0.016 off in
entries below 1, and the exact hypergradient built from it 0.02 off, where op-by-op evaluation
(and jit with these fusions off) is exact to 1e-15. So every program the package compiles on the
CPU turns those fusions off, where the jaxlib knows the option (older and newer ones that refuse
it compile with their defaults). ``tests/test_metrics_cache.py`` checks that problem against its
closed form under jit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

__all__ = ["jit_options"]

#: the XLA:CPU option that turns the YNNPACK fusions off (empty: no fusion type)
_OPTION = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.cache
def jit_options() -> dict:
    """Keyword arguments for ``jax.jit``: ``{"compiler_options": ...}`` on a CPU backend whose
    jaxlib accepts the option, else ``{}``."""
    if jax.default_backend() != "cpu":
        return {}
    options = {"compiler_options": dict(_OPTION)}
    try:  # a jaxlib without the option refuses it at compile time
        jax.jit(jnp.negative, **options).lower(1.0).compile()
    except Exception:  # noqa: BLE001  (any refusal means: compile with the defaults)
        return {}
    return options
