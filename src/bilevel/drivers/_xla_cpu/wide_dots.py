"""Keep wide matrix products wide on XLA:CPU: the weight gradient of a linear layer.

Reverse-mode AD computes the gradient of ``X @ W`` (``X``: a minibatch ``(b, d)``, ``W``:
``(d, c)`` with few outputs ``c``) as ``transpose(D^T X)``: a product with a wide ``(c, d)``
output, then a transpose. XLA's algebraic simplifier folds the transpose into the product, which
then has a narrow ``(d, c)`` output, and XLA:CPU's matrix kernels run that shape 2-3x slower
(measured with jax 0.10.2 on a 2-core x86 CPU: 42 against 19 us for ``d`` 784, ``c`` 10,
``b`` 64; ``docs/performance.md``). Every softmax / logistic regression and every network's last
layer has this pattern.

The rewrite puts an ``optimization_barrier`` on the output of each rank-2 product that is wide
(output ``(m, n)`` with ``2 m <= n``, its right operand contracted on its leading axis:
:func:`is_wide`) and is transposed afterwards (:func:`transposed_vars`): the barrier is an
identity that XLA may not look through, so the product keeps its fast shape and the transpose
stays a separate copy of ``m n`` numbers. The evaluator (``evaluate``) applies it on the same
pass as the other rewrites, after all differentiation has happened: the rewritten program is
compiled, never differentiated. Values are those of the original program exactly (the barrier
is an identity).
"""

from __future__ import annotations

from jax import lax
from jax.extend import core as jcore

__all__ = ["transposed_vars", "is_wide", "needs_barrier", "barrier"]


def transposed_vars(jaxpr) -> set:
    """The variables that some equation of ``jaxpr`` transposes."""
    return {
        v
        for eqn in jaxpr.eqns
        if eqn.primitive is lax.transpose_p
        for v in eqn.invars
        if not isinstance(v, jcore.Literal)
    }


def is_wide(eqn) -> bool:
    """A rank-2 product without batch dimensions whose output is at least twice as wide as
    it is tall, and whose right operand is contracted on its leading axis.

    The last condition picks the products whose folded form is slow: folding the transpose
    swaps the operands, so the right one becomes a left operand contracted on its leading axis
    (``X^T D`` for the weight gradient). The linear map's products in a cross derivative,
    ``W^T X^T`` (right operand contracted on its trailing axis), fold into ``X W``, the fast
    forward product: barring that fold measured 66 against ~20 us for SOBA's cross product.
    """
    (_, rhs_contract), (lhs_batch, _) = eqn.params["dimension_numbers"]
    shape = eqn.outvars[0].aval.shape
    ranks = [v.aval.ndim for v in eqn.invars]
    wide = not lhs_batch and ranks == [2, 2] and len(shape) == 2 and 2 * shape[0] <= shape[1]
    return wide and tuple(rhs_contract) == (0,)


def needs_barrier(eqn, transposed) -> bool:
    """Whether the output of ``eqn`` gets a barrier: a wide product (:func:`is_wide`) that
    some equation transposes (its output is in ``transposed``, from :func:`transposed_vars`)."""
    return eqn.primitive is lax.dot_general_p and eqn.outvars[0] in transposed and is_wide(eqn)


def barrier(value):
    """``value`` behind an ``optimization_barrier``: XLA may not fold what follows into the
    product that made it."""
    return lax.optimization_barrier(value)
