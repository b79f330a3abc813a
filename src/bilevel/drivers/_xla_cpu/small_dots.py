"""Small matrix products as fused multiply-reduce on XLA:CPU: vmapped seeds of small problems.

A small product costs XLA:CPU a library call (YNNPACK or Eigen, with its own overhead) and ends
the elementwise kernel around it, where the same sum written as a broadcast multiply and a
reduction joins that kernel. A step of one seed has mostly matrix-vector products, which
XLA:CPU runs well from a few hundred multiply-adds on (:data:`MAX_VECTOR_MULTIPLY_ADDS`).
But ``vmap`` turns the matrix-vector products of several seeds (or a sweep's grid points) into
matrix-matrix or batched products, which it leaves to the library: on the quadratic
``bl.problems.quadratic(2, 5)``, 10 vmapped seeds of F2SA took 23.6 us per step against 1.3 us
for one seed, and 5.6 us with this rewrite (one seed: 1.0 us; measured 2026-11-25,
``docs/performance.md``). Larger products are left alone: a matrix-vector product of 900
multiply-adds, or a matrix-matrix one of 4,000, measured slower as multiply-reduce.

:func:`keep_small` says which ``dot_general`` equations to rewrite (float32 or float64, at most
:data:`MAX_MULTIPLY_ADDS` multiply-adds), :func:`multiply_reduce` computes one. The evaluator
(``evaluate``) applies them on the same pass as the other rewrites where the options say
``small_dots``. The values are the product's up to summation order.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

__all__ = [
    "MAX_MULTIPLY_ADDS",
    "MAX_VECTOR_MULTIPLY_ADDS",
    "keep_small",
    "multiply_reduce",
]

#: the largest products written as multiply-reduce (output entries times contracted length): a
#: matrix-matrix or batched product (what vmap makes of several seeds' matrix-vector products;
#: 4,000 measured slower), and a plain matrix-vector product (900 measured slower)
MAX_MULTIPLY_ADDS = 1024
MAX_VECTOR_MULTIPLY_ADDS = 256


def multiply_adds(eqn) -> int:
    """Output entries times the contracted length of a ``dot_general`` equation."""
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    return math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lhs_contract)


def keep_small(eqn) -> bool:
    """Whether ``eqn`` is a float32 / float64 ``dot_general`` to write as multiply-reduce: at most
    :data:`MAX_MULTIPLY_ADDS` multiply-adds, or :data:`MAX_VECTOR_MULTIPLY_ADDS` for a plain
    matrix-vector product (one operand with no free axis, no batch axis)."""
    if eqn.primitive is not lax.dot_general_p:
        return False
    # float32 / float64 only: a half-precision sum would also accumulate in half precision
    if not all(v.aval.dtype in (jnp.float32, jnp.float64) for v in eqn.invars):
        return False
    (contract, _), (batch, _) = eqn.params["dimension_numbers"]
    free = [v.aval.ndim - len(contract) - len(batch) for v in eqn.invars]
    vector = not batch and min(free) == 0
    return multiply_adds(eqn) <= (MAX_VECTOR_MULTIPLY_ADDS if vector else MAX_MULTIPLY_ADDS)


def multiply_reduce(lhs, rhs, *, dimension_numbers, preferred_element_type=None, **_):
    """``lax.dot_general(lhs, rhs, dimension_numbers)`` as a broadcast product summed over the
    contracted axes: the output's axes are the batch axes, then the left operand's free axes,
    then the right's, as ``dot_general``'s. (``precision`` and the other parameters of a CPU
    product have no counterpart here.)"""
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    if preferred_element_type is not None:
        lhs, rhs = lhs.astype(preferred_element_type), rhs.astype(preferred_element_type)
    lhs_free = [d for d in range(lhs.ndim) if d not in (*lhs_contract, *lhs_batch)]
    rhs_free = [d for d in range(rhs.ndim) if d not in (*rhs_contract, *rhs_batch)]
    # (batch, lhs free, rhs free, contracted), with size-1 axes where an operand has none
    lhs = jnp.transpose(lhs, (*lhs_batch, *lhs_free, *lhs_contract))
    rhs = jnp.transpose(rhs, (*rhs_batch, *rhs_free, *rhs_contract))
    batch, contract = len(lhs_batch), len(lhs_contract)
    lhs = jnp.expand_dims(
        lhs, tuple(range(batch + len(lhs_free), batch + len(lhs_free) + len(rhs_free)))
    )
    rhs = jnp.expand_dims(rhs, tuple(range(batch, batch + len(lhs_free))))
    axes = tuple(range(lhs.ndim - contract, lhs.ndim))
    return jnp.sum(lhs * rhs, axis=axes)
