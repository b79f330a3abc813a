"""Keep wide matrix products wide on XLA:CPU: the weight gradient of a linear layer.

Reverse-mode AD computes the gradient of ``X @ W`` (``X``: a minibatch ``(b, d)``, ``W``:
``(d, c)`` with few outputs ``c``) as ``transpose(D^T X)``: a product with a wide ``(c, d)``
output, then a transpose. XLA's algebraic simplifier folds the transpose into the product, which
then has a narrow ``(d, c)`` output, and XLA:CPU's matrix kernels run that shape 2-3x slower
(measured with jax 0.10.2 on a 2-core x86 CPU: 42 against 19 us for ``d`` 784, ``c`` 10,
``b`` 64; ``docs/performance.md``). Every softmax / logistic regression and every network's last
layer has this pattern.

:func:`keep_wide_dots` re-traces a function's jaxpr (recursing into ``scan``, ``while``,
``cond``, ``jit`` and the custom-derivative calls) and puts an ``optimization_barrier`` on the
output of each rank-2 product that is wide (output ``(m, n)`` with ``2 m <= n``, its right
operand contracted on its leading axis: :func:`_is_wide`) and is transposed afterwards: the
barrier is an identity that XLA may not look through, so the product keeps its fast shape and
the transpose stays a separate copy of ``m n`` numbers. On the same pass it merges independent
products that share an operand into one (an HVP's ``X W`` and ``X V``: :mod:`bilevel.drivers._xla_cpu.dot_merge`,
after :func:`bilevel.drivers._xla_cpu.dot_merge.simplify` has written each jaxpr's products in XLA's form and
removed its duplicate and dead equations), lets loops carry narrow weight matrices as their
transposes where that makes their updates flat (:mod:`bilevel.drivers._xla_cpu.carry_layout`), and writes small
products as a multiply and a reduction that join the kernels around them
(:mod:`bilevel.drivers._xla_cpu.small_dots`: vmapped seeds of small problems) and PRNG key splits and
random bits out as fused kernels (:mod:`bilevel.drivers._xla_cpu.unrolled_keys`: the same words, bit for bit).
Values are those of the original program up to floating-point summation order.

``bl.solve`` applies it to its compiled chunk of solver steps on CPU (one device; not under a
mesh) after all differentiation has happened: the rewritten program is compiled, never
differentiated. ``BILEVEL_WIDE_DOTS=0`` in the environment turns the whole rewrite off,
``BILEVEL_MERGE_DOTS=0`` only the merging, ``BILEVEL_CARRY_LAYOUT=0`` only the transposed
carries, ``BILEVEL_SMALL_DOTS=0`` only the small products, ``BILEVEL_UNROLLED_KEYS=0`` only the
key splits and draws.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.extend import core as jcore

from bilevel.drivers._xla_cpu import carry_layout, dot_merge, small_dots, unrolled_keys

__all__ = ["keep_wide_dots", "enabled"]

_log = logging.getLogger(__name__)

#: primitives whose jaxpr parameters are rewritten too (any other primitive is bound as it is)
_HIGHER_ORDER = frozenset(
    {
        "scan",
        "while",
        "cond",
        "pjit",
        "jit",
        "closed_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "checkpoint",
        "remat",
    }
)


def enabled(mesh=None) -> bool:
    """Whether ``bl.solve`` rewrites its chunk: on the CPU backend, without a device mesh, and
    unless ``BILEVEL_WIDE_DOTS=0``."""
    if os.environ.get("BILEVEL_WIDE_DOTS", "1") == "0" or mesh is not None:
        return False
    return jax.default_backend() == "cpu"


def transposing() -> bool:
    """Whether :func:`keep_wide_dots` also carries narrow matrices transposed through loops
    (:mod:`bilevel.drivers._xla_cpu.carry_layout`): unless ``BILEVEL_CARRY_LAYOUT=0``."""
    return os.environ.get("BILEVEL_CARRY_LAYOUT", "1") != "0"


def merging() -> bool:
    """Whether :func:`keep_wide_dots` also merges products that share an operand
    (:mod:`bilevel.drivers._xla_cpu.dot_merge`): unless ``BILEVEL_MERGE_DOTS=0``."""
    return os.environ.get("BILEVEL_MERGE_DOTS", "1") != "0"


def keep_wide_dots(fn: Callable) -> Callable:
    """``fn`` with a barrier after every wide, transposed rank-2 product and, unless
    ``BILEVEL_MERGE_DOTS=0``, products that share an operand merged (module docstring).

    The returned function traces ``fn`` to a jaxpr at each call (so it is meant to be called
    under ``jax.jit``) and evaluates the rewritten jaxpr. If the rewrite fails (a primitive it
    cannot re-bind), it logs why and evaluates ``fn`` unchanged: it is a speed-up, never a
    reason for a program to fail.
    """

    def rewritten(*args):
        carry_layout.forget()  # decisions are per program (and hold its jaxprs)
        flat, treedef = jax.tree.flatten(args)
        closed, out_shape = jax.make_jaxpr(
            lambda *leaves: fn(*jax.tree.unflatten(treedef, leaves)), return_shape=True
        )(*flat)
        try:
            outs = _evaluate(
                closed.jaxpr, closed.consts, flat, merge=merging(), transpose=transposing()
            )
        except Exception as err:  # noqa: BLE001  (a speed-up must never break a program)
            _log.info("keep_wide_dots: left %s unchanged (%s)", getattr(fn, "__name__", fn), err)
            return fn(*args)
        return jax.tree.unflatten(jax.tree.structure(out_shape), outs)

    return rewritten


def _transposed_vars(jaxpr) -> set:
    """The variables that some equation of ``jaxpr`` transposes."""
    return {
        v
        for eqn in jaxpr.eqns
        if eqn.primitive is lax.transpose_p
        for v in eqn.invars
        if not isinstance(v, jcore.Literal)
    }


def _is_wide(eqn) -> bool:
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


def _evaluate(
    jaxpr,
    consts,
    args,
    *,
    merge: bool,
    transpose: bool = False,
    invariant: tuple[int, ...] = (),
    rep_args: dict | None = None,
    rep_outs: dict | None = None,
) -> list:
    """Evaluate ``jaxpr`` (like ``jax.core.eval_jaxpr``), with barriers after wide products
    that are transposed, with ``merge`` the products that share an operand merged
    (:mod:`bilevel.drivers._xla_cpu.dot_merge`; ``invariant``: the positions of the inputs that are constants
    of an enclosing loop), with ``transpose`` loops carrying narrow matrices transposed
    (:mod:`bilevel.drivers._xla_cpu.carry_layout`; ``rep_args``, ``rep_outs``: the positions of the inputs given
    and outputs wanted transposed, with their classes), and every higher-order primitive's
    jaxprs rewritten the same way."""
    env: dict[Any, Any] = {}
    reps = carry_layout.Representations()
    small = small_dots.enabled()
    keys = unrolled_keys.enabled()

    def read(v):
        return v.val if isinstance(v, jcore.Literal) else env[v]

    def write(outvars, values):
        for var, value in zip(outvars, values, strict=True):
            if not isinstance(var, jcore.DropVar):
                env[var] = value

    def evaluate(sub, sub_consts, sub_args, sub_invariant, sub_rep_args=None, sub_rep_outs=None):
        options = dict(merge=merge, transpose=transpose, invariant=sub_invariant)
        return _evaluate(
            sub, sub_consts, sub_args, rep_args=sub_rep_args, rep_outs=sub_rep_outs, **options
        )

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for position, cls in (rep_args or {}).items():
        var = jaxpr.invars[position]
        reps.set(var, args[position], cls)
        env[var] = carry_layout.from_representation(args[position], cls, var.aval.shape)
    if merge:
        jaxpr = dot_merge.simplify(jaxpr)
    fixed = dot_merge.loop_invariant(jaxpr, invariant) if merge else set()
    groups = dot_merge.merge_groups(jaxpr, fixed) if merge else []
    transposed = _transposed_vars(jaxpr)
    for node in dot_merge.schedule(jaxpr, groups):
        eqns = [jaxpr.eqns[i] for i in node]
        if len(eqns) > 1:
            barrier = any(e.outvars[0] in transposed and _is_wide(e) for e in eqns)
            stack = functools.partial(reps.stack, read=read) if transpose else None
            write([e.outvars[0] for e in eqns], dot_merge.bind_merged(eqns, read, barrier, stack))
            continue
        (eqn,) = eqns
        params = eqn.params
        if eqn.primitive.name in _HIGHER_ORDER:
            invariants = dot_merge.sub_invariants(eqn, fixed)
            outs = _bind_transposed(eqn, read, reps, evaluate, invariants) if transpose else None
            if outs is not None:
                write(eqn.outvars, outs)
                continue
            params = {
                name: _rewrite_param(value, merge, transpose, invariants.get(name, ()))
                for name, value in params.items()
            }
        bind_params = eqn.primitive.get_bind_params(params)
        with eqn.ctx.manager:
            if small and small_dots.keep_small(eqn):
                outs = small_dots.multiply_reduce(*map(read, eqn.invars), **bind_params)
            elif keys and unrolled_keys.applies(eqn):
                outs = unrolled_keys.evaluate(eqn, read(eqn.invars[0]))
            else:
                outs = eqn.primitive.bind(*map(read, eqn.invars), **bind_params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        if eqn.primitive is lax.dot_general_p and eqn.outvars[0] in transposed and _is_wide(eqn):
            outs = [lax.optimization_barrier(outs[0])]
        write(eqn.outvars, outs)
        if transpose:
            reps.note(eqn, read, write)
    outs = [read(v) for v in jaxpr.outvars]
    for position, cls in (rep_outs or {}).items():
        outs[position] = reps.of(jaxpr.outvars[position], outs[position], cls)
    return outs


def _bind_transposed(eqn, read, reps, evaluate, invariants) -> list | None:
    """A loop with some carries transposed, or a call evaluated inline so that its inputs and
    outputs keep their transposed forms (:mod:`bilevel.drivers._xla_cpu.carry_layout`); None where neither
    applies, or where it fails (a loop whose carry types it could not keep: the equation is
    then rewritten as usual)."""
    try:
        if eqn.primitive.name in ("scan", "while"):
            carried = carry_layout.loop_carries(eqn)
            if carried:
                return carry_layout.bind_loop(eqn, carried, read, reps, evaluate, invariants)
        elif carry_layout.call_jaxpr(eqn) is not None:
            name = carry_layout.CALLS[eqn.primitive.name]
            return carry_layout.inline_call(eqn, read, reps, evaluate, invariants[name])
    except Exception as err:  # noqa: BLE001  (a speed-up must never break a program)
        _log.info("carry_layout: left a %s as it was (%s)", eqn.primitive.name, err)
    return None


def _rewrite_param(value, merge: bool, transpose: bool, invariant: tuple[int, ...]):
    if isinstance(value, jcore.ClosedJaxpr):
        return _rewrite_closed(value, merge, transpose, invariant)
    if isinstance(value, tuple) and value and all(isinstance(v, jcore.ClosedJaxpr) for v in value):
        return tuple(_rewrite_closed(v, merge, transpose, invariant) for v in value)
    return value


def _rewrite_closed(closed, merge: bool, transpose: bool, invariant: tuple[int, ...]):
    """``closed`` re-traced through :func:`_evaluate`, with the same input avals."""
    avals = [v.aval for v in closed.jaxpr.invars]
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    evaluate = functools.partial(
        _evaluate,
        closed.jaxpr,
        closed.consts,
        merge=merge,
        transpose=transpose,
        invariant=invariant,
    )
    new = jax.make_jaxpr(lambda *args: evaluate(args))(*structs)
    if [v.aval for v in new.jaxpr.invars] != avals:
        raise TypeError("re-traced jaxpr changed its input types")
    return new
