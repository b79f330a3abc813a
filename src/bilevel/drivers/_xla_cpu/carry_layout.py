"""Narrow matrices carried transposed through loops (XLA:CPU).

The weights of a linear layer with few outputs, ``W`` of shape ``(d, c)`` (784 x 10 for
softmax regression on images), are updated in every inner step by ``W - lr * G^T``, where the
gradient ``G = D^T X`` is a wide ``(c, d)`` product (kept wide by ``wide_dots``).
XLA:CPU runs that update as an elementwise loop over a ``(d, c)`` array whose 10-wide rows it
vectorises poorly, reading ``G`` transposed: 6-10 us per update of 7,840 numbers on a 2-core
x86 CPU (jax 0.10.2), where the same numbers in one flat pass take about 2 us. With the weights
stored as ``W^T``, a whole solver step on benchopt's data cleaning was 6-10% faster
(``docs/performance.md``, the "transposed" layout); but the layout is the user's choice.

This module lets a loop carry such a matrix as its transpose without the user knowing: a loop
carry ``v`` (a narrow ``(m, c)`` matrix, or a vector that the loop body reshapes to one) is
carried as ``v' = transpose(reshape(v, (m, c)))``, of shape ``(c, m)``, when the body computes
its next value from the transposes of wide products by elementwise operations only (adds,
products by scalars, ...), so that the next ``v'`` needs no transpose at all. Inside the loop
the other uses of ``v`` read ``transpose(v')``, which XLA folds into the matrix products that
consume it (``X @ W`` becomes a product contracting ``W^T``'s trailing axis, as with the
``W^T`` layout). The transpose is taken once when the loop starts and undone once when it ends.

Pieces, for the evaluator (``evaluate``), which evaluates jaxprs through them:

* :func:`rule`: whether an equation's output has a transposed form computable from its
  operands' transposed forms (the "representation" of a variable), and how;
* :func:`loop_carries`: which carries of a ``scan`` or ``while`` to carry transposed: those
  whose next value has a representation when the carries do (a fixed point over the body);

and, in ``carry_loops``, the evaluation: the evaluator's table of representations, kept beside
the values, and the loops rebuilt with those carries transposed.

The program's values are those of the original up to floating-point summation order (a
transpose moves numbers, it does not change them; the elementwise operations are the same).
Measured on data cleaning (``docs/performance.md``, item 10): 1.05-1.17x per step for the
solvers whose loops update the weights by gradient steps (stocBiO 1.10x, TTSA 1.10-1.13x),
bringing benchopt's ``(784, 10)`` layout to the speed of the ``W^T`` one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp

from bilevel.drivers._xla_cpu.dot_merge import _is_row_major_reshape, _is_var

__all__ = [
    "narrow_class",
    "rule",
    "flow",
    "CALLS",
    "call_jaxpr",
    "input_classes",
    "call_classes",
    "loop_carries",
    "forget",
]

#: a narrow matrix ``(m, c)``: at most this many columns ...
MAX_COLUMNS = 16
#: ... at least this many times as many rows as columns ...
MIN_ASPECT = 8
#: ... and at least this many entries (smaller updates cost too little to matter)
MIN_SIZE = 2048

Class = tuple[int, int]  # (m, c): the natural shape of a narrow matrix; its transpose is (c, m)

#: primitives applied entry by entry, with operands of one shape (or scalars)
ELEMENTWISE = frozenset(
    {
        "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "abs", "sign", "square",
        "sqrt", "rsqrt", "exp", "log", "log1p", "tanh", "logistic", "integer_pow", "pow",
        "convert_element_type", "select_n", "is_finite", "eq", "ne", "lt", "le", "gt", "ge",
        "and", "or", "not", "clamp", "copy", "stop_gradient",
    }
)  # fmt: skip
#: reductions that do not see the order of the entries when they reduce all axes
REDUCE_ALL = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or"})


def narrow_class(shape: tuple[int, ...]) -> Class | None:
    """``(m, c)`` for a narrow matrix shape (module constants), else None."""
    if len(shape) != 2:
        return None
    m, c = shape
    if c <= MAX_COLUMNS and m >= MIN_ASPECT * c and m * c >= MIN_SIZE:
        return (m, c)
    return None


def _is_float(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.floating)


def rule(eqn, class_of: Callable, uniform: Callable) -> tuple[str, Class | None] | None:
    """How ``eqn``'s output gets a representation, or None where it does not.

    ``class_of(v)``: the class of ``v``'s representation, None if it has none; ``uniform(v)``:
    whether ``v`` is a scalar broadcast to an array. Returns ``(kind, class)``:

    * ``("alias", cls)``: a reshape of a represented variable has the same representation;
    * ``("wrap", cls)``: the transpose of a ``(c, m)`` value is represented by that value;
    * ``("unwrap", None)``: the transpose of a represented ``(m, c)`` matrix *is* the
      representation (the output is then a value, not represented);
    * ``("elementwise", cls)``: the operation applied to the operands' representations
      (scalars as they are, uniform arrays broadcast to ``(c, m)``);
    * ``("reduce", None)``: a reduction over all axes, applied to the representation;
    * ``("contract", None)``: the inner product of two represented vectors, of their
      representations;
    * ``("uniform", None)``: a scalar broadcast to an array.
    """
    name = eqn.primitive.name
    if eqn.primitive.multiple_results or len(eqn.outvars) != 1 or not eqn.invars:
        return None
    out = eqn.outvars[0].aval
    args = eqn.invars
    if name == "broadcast_in_dim" and args[0].aval.ndim == 0 and len(args) == 1:
        return ("uniform", None)
    represented = _is_var(args[0]) and class_of(args[0]) is not None
    if represented and _is_row_major_reshape(eqn):
        return ("alias", class_of(args[0]))
    if name == "transpose" and out.ndim == 2 and tuple(eqn.params["permutation"]) == (1, 0):
        cls = class_of(args[0]) if _is_var(args[0]) else None
        if cls is not None and args[0].aval.shape == cls:
            return ("unwrap", None)
        wrapped = narrow_class(out.shape)
        return ("wrap", wrapped) if wrapped is not None else None
    if name in REDUCE_ALL and represented:
        if tuple(eqn.params["axes"]) == tuple(range(args[0].aval.ndim)):
            return ("reduce", None)
        return None
    if name == "dot_general" and len(args) == 2:
        return _product_rule(eqn, class_of)
    if name not in ELEMENTWISE or out.ndim == 0:
        return None
    classes = set()
    for v in args:
        if v.aval.ndim == 0 or (_is_var(v) and uniform(v)):
            continue
        if not _is_var(v) or v.aval.shape != out.shape or class_of(v) is None:
            return None
        classes.add(class_of(v))
    if len(classes) != 1:
        return None
    return ("elementwise", classes.pop())


def _product_rule(eqn, class_of: Callable) -> tuple[str, Class | None] | None:
    """A ``dot_general`` that is an inner product of two vectors represented alike
    (``("contract", None)``: the same sum over the representations), or a scalar times a
    represented array (``("elementwise", cls)``)."""
    a, b = eqn.invars
    classes = [class_of(v) if _is_var(v) else None for v in (a, b)]
    (contract_a, contract_b), batch = eqn.params["dimension_numbers"]
    if any(batch[0]) or any(batch[1]):
        return None
    if a.aval.ndim == b.aval.ndim == 1 and classes[0] is not None and classes[0] == classes[1]:
        return (
            ("contract", None) if (tuple(contract_a), tuple(contract_b)) == ((0,), (0,)) else None
        )
    if not contract_a and not contract_b:
        if a.aval.ndim == 0 and classes[1] is not None:
            return ("elementwise", classes[1])
        if b.aval.ndim == 0 and classes[0] is not None:
            return ("elementwise", classes[0])
    return None


def _carry_slots(eqn):
    """``(body, first carry position among the body's inputs, number of carries, positions
    of the carries the loop condition reads)`` of a ``scan`` or ``while`` equation."""
    params = eqn.params
    if eqn.primitive.name == "scan":
        return params["jaxpr"].jaxpr, params["num_consts"], params["num_carry"], set()
    body = params["body_jaxpr"].jaxpr
    cond = params["cond_jaxpr"].jaxpr
    carries = cond.invars[params["cond_nconsts"] :]
    read = {v for e in cond.eqns for v in e.invars if _is_var(v)}
    read.update(v for v in cond.outvars if _is_var(v))
    in_cond = {k for k, v in enumerate(carries) if v in read}
    return body, params["body_nconsts"], len(body.outvars), in_cond


def _candidate(var, body) -> Class | None:
    """The class a carry would be represented with: its own shape if it is a narrow matrix,
    else the narrow shape the body reshapes it to."""
    if not _is_float(var.aval):
        return None
    own = narrow_class(var.aval.shape)
    if own is not None:
        return own
    for eqn in body.eqns:
        if eqn.primitive.name == "reshape" and eqn.invars[0] is var:
            cls = narrow_class(eqn.outvars[0].aval.shape)
            if cls is not None:
                return cls
    return None


def flow(jaxpr, given: Mapping[int, Class]) -> dict[int, Class]:
    """The classes of ``jaxpr``'s outputs (by position) that have a representation when its
    inputs at the positions of ``given`` have one: :func:`rule` applied symbolically."""
    classes: dict = {v: given[k] for k, v in enumerate(jaxpr.invars) if k in given}
    uniforms: set = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("scan", "while"):
            carried = loop_carries(eqn)
            for k, cls in carried.items():  # a loop's first outputs are its carries
                classes[eqn.outvars[k]] = cls
            continue
        if call_jaxpr(eqn) is not None:
            for k, cls in call_classes(eqn, classes.get).items():
                classes[eqn.outvars[k]] = cls
            continue
        how = rule(eqn, classes.get, uniforms.__contains__)
        if how is None:
            continue
        kind, cls = how
        if kind == "uniform":
            uniforms.add(eqn.outvars[0])
        elif cls is not None:
            classes[eqn.outvars[0]] = cls
    out = {}
    for k, v in enumerate(jaxpr.outvars):
        if _is_var(v) and v in classes:
            out[k] = classes[v]
    return out


#: call primitives, and the parameter holding the called jaxpr
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr"}


def call_jaxpr(eqn):
    """The closed jaxpr a call equation calls, or None for any other equation."""
    name = CALLS.get(eqn.primitive.name)
    return None if name is None else eqn.params.get(name)


def input_classes(eqn, class_of: Callable) -> dict[int, Class]:
    """The classes of an equation's represented inputs (by position)."""
    return {k: cls for k, v in enumerate(eqn.invars) if _is_var(v) and (cls := class_of(v))}


def call_classes(eqn, class_of: Callable) -> dict[int, Class]:
    """The classes of a call's represented outputs (by position), given its inputs'."""
    return flow(call_jaxpr(eqn).jaxpr, input_classes(eqn, class_of))


_DECIDED: dict[int, tuple[Any, dict[int, Class]]] = {}


def forget() -> None:
    """Drop :func:`loop_carries`' decisions (they are kept by loop body while one program is
    rewritten: a body is reached once for each loop around it)."""
    _DECIDED.clear()


def loop_carries(eqn) -> dict[int, Class]:
    """The carries (by index among the loop's carries) that ``carry_loops.bind_loop`` carries
    transposed, with their classes.

    Candidates are the narrow matrices and the vectors that the body reshapes to one
    (:func:`_candidate`), then any carry whose next value has a representation when the
    candidates have one (a vector passed through calls to the products that use it); of these,
    those whose next value has a representation when all the kept ones have one, to a fixed
    point. A ``while`` loop's carries that its condition reads stay as they are."""
    body, first, count, in_cond = _carry_slots(eqn)
    cached = _DECIDED.get(id(body))
    if cached is not None and cached[0] is body:
        return cached[1]
    carries = body.invars[first : first + count]
    chosen = {
        k: cls
        for k, v in enumerate(carries)
        if k not in in_cond and (cls := _candidate(v, body)) is not None
    }
    while True:  # grow: carries whose next value is represented if the chosen ones are
        out = flow(body, {first + k: cls for k, cls in chosen.items()})
        grown = dict(chosen)
        for k, cls in out.items():
            if k < count and k not in in_cond and _is_float(carries[k].aval):
                grown.setdefault(k, cls)
        # and, tentatively, the vectors of a chosen class's size (a running sum of the
        # chosen ones: its next value is represented only if it is)
        sizes = {m * c: (m, c) for m, c in grown.values()}
        for k, v in enumerate(carries):
            if k not in in_cond and _is_float(v.aval) and v.aval.ndim == 1 and v.aval.size in sizes:
                grown.setdefault(k, sizes[v.aval.size])
        if grown == chosen:
            break
        chosen = grown
    while chosen:  # prune to the carries whose next value keeps its representation
        out = flow(body, {first + k: cls for k, cls in chosen.items()})
        kept = {k: cls for k, cls in chosen.items() if out.get(k) == cls}
        if kept == chosen:
            break
        chosen = kept
    _DECIDED[id(body)] = (body, chosen)
    return chosen
