"""One matrix product where a program makes several with the same operand (XLA:CPU).

A Hessian-vector product by forward-over-reverse differentiation of a linear model evaluates
``X @ W`` (the primal) and ``X @ V`` (the tangent) on the same minibatch ``X``; a fused pass
(SOBA's gradient, HVP and cross product) makes its backward products ``D_k^T X`` in pairs too.
XLA:CPU compiles each as its own kernel, reading ``X`` once per product (seen in the compiled
HLO; XLA has a ``DotMerger`` pass for this, which its CPU pipeline did not apply here). Stacked
into one product, ``X @ [W, V]`` reads ``X`` once: on a 2-core x86 CPU (jax 0.10.2), for ``X``
(64, 784) and ``W``, ``V`` (784, 10), 39 against 52 us for the pair; stocBiO's Neumann loop on
data cleaning 1,300 -> 1,180 us per step (``docs/performance.md``).

This module plans that rewrite on a jaxpr, for the evaluator (``evaluate``), which re-traces
the program through it:

* :func:`simplify`: products in the form XLA gives them (transposes folded into the
  contraction, products by one and ravel-unravel round trips dropped), common-subexpression
  elimination, then dead-code elimination. All matter before merging: XLA shares an HVP's
  primal ``X @ W`` with the gradient's identical product (two oracle calls on one minibatch),
  and SOBA's cross product ``(V^T X^T)^T`` with its HVP's ``X @ V``, which a merge made before
  that sharing would undo, and an HVP's primal gradient is dead code that XLA drops, unless a
  merge ties it to the live tangent product;
* :func:`merge_groups`: the ``dot_general`` equations that share one operand (the same
  variable, in the same position, with the same parameters and equally shaped other operands)
  where neither depends on the other. Left out, each for a measured reason given where it is
  decided: products whose shared operand holds fewer than :data:`MIN_SHARED_RATIO` times the
  numbers of the other, matrix-vector products, a product that XLA may share with a transposed
  partner, and a loop-invariant product with one that is not;
* :func:`schedule`: an evaluation order with each group as one node (a topological order of
  the merged graph; the unmerged order when merging would make a cycle);
* :func:`bind_merged`: the group's product on the stacked other operands, and each member's
  output sliced out of it.

The program's values are those of the original up to floating-point summation order.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Sequence

import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore

__all__ = ["MIN_SHARED_RATIO", "simplify", "merge_groups", "schedule", "bind_merged"]

#: merge only where the shared operand has at least this many times the other's numbers
MIN_SHARED_RATIO = 4

Node = tuple[int, ...]  # equation indices evaluated together (one, or a merged group)


def _is_var(v) -> bool:
    return not isinstance(v, jcore.Literal)


def _cse_key(eqn, resolve):
    """A hashable identity of an effect-free equation (its primitive, inputs and parameters),
    or None where it has none. Higher-order equations count too, their jaxprs by printed form
    (:func:`_param_key`): two oracle calls on one minibatch draw it twice (a ``cond`` each),
    which XLA shares, and so must this, or their products would not share an operand."""
    if eqn.effects:
        return None
    if any(isinstance(v, jcore.DropVar) for v in eqn.outvars):
        return None
    try:
        inputs = tuple(
            resolve(v) if _is_var(v) else ("literal", repr(v.val), v.aval) for v in eqn.invars
        )
        params = tuple(sorted((k, _param_key(p)) for k, p in eqn.params.items()))
        key = (eqn.primitive, inputs, params)
        hash(key)
    except TypeError:
        return None
    return key


def _param_key(value):
    """A hashable stand-in for an equation parameter (TypeError where there is none). A
    function counts by identity, a jaxpr by its printed form plus the identities of the
    functions and constants in it (the printed form may name two different functions alike)."""
    if isinstance(value, jcore.ClosedJaxpr):
        return ("closed", _param_key(value.jaxpr), tuple(id(c) for c in value.consts))
    if isinstance(value, jcore.Jaxpr):
        if any(eqn.effects for eqn in value.eqns):
            raise TypeError("a jaxpr with effects")
        inner = tuple(_param_key(p) for eqn in value.eqns for p in eqn.params.values())
        return ("jaxpr", str(value), inner)
    if isinstance(value, tuple):
        return tuple(_param_key(v) for v in value)
    if callable(value) and not isinstance(value, type):
        return ("callable", id(value))
    return repr(value)


def _is_one(v) -> bool:
    return isinstance(v, jcore.Literal) and v.aval.shape == () and v.val == 1


def _matrix_dims(eqn):
    """``(lhs_contract, rhs_contract)`` of a rank-2 by rank-2 ``dot_general`` without batch
    dimensions (one contracted axis each), or None for any other equation."""
    if eqn is None or eqn.primitive is not lax.dot_general_p:
        return None
    (lhs_contract, rhs_contract), batch = eqn.params["dimension_numbers"]
    if any(batch) or [v.aval.ndim for v in eqn.invars] != [2, 2] or len(lhs_contract) != 1:
        return None
    return lhs_contract[0], rhs_contract[0]


def _is_row_major_reshape(eqn) -> bool:
    return (
        eqn is not None
        and eqn.primitive is lax.reshape_p
        and eqn.params.get("dimensions") is None
        and len(eqn.invars) == 1
        and _is_var(eqn.invars[0])
    )


def _with_dims(eqn, invars, lhs_contract: int, rhs_contract: int, outvars=None):
    dims = (((lhs_contract,), (rhs_contract,)), ((), ()))
    return eqn.replace(
        invars=list(invars),
        outvars=eqn.outvars if outvars is None else outvars,
        params=dict(eqn.params, dimension_numbers=dims),
    )


def _canonical(eqn, producer: dict, uses: Counter):
    """``eqn`` in the form XLA gives it after its own simplifications, so that products it
    computes once are one equation here too: a product by the literal 1 is its other operand
    (returned as a variable); a matrix transpose feeding a product becomes the product's
    contracting axis; the transpose of a product ``P^T Q^T`` (``P`` contracted on its leading,
    ``Q`` on its trailing axis) becomes the plain matrix product ``Q P`` (where the transpose
    is the product's only use: otherwise both would be computed). SOBA's cross product
    ``V^T X^T``, transposed, is then its HVP's ``X V``, and shares ``X`` with ``X W``."""
    if eqn.primitive is lax.dot_general_p and eqn.params["dimension_numbers"] == (
        ((), ()),
        ((), ()),
    ):
        for one, other in (eqn.invars, eqn.invars[::-1]):
            if _is_one(one) and _is_var(other) and other.aval == eqn.outvars[0].aval:
                return other
    dims = _matrix_dims(eqn)
    if dims is not None:
        invars, dims = list(eqn.invars), list(dims)
        for k, v in enumerate(invars):
            source = producer.get(v) if _is_var(v) else None
            if source is not None and source.primitive is lax.transpose_p:
                if source.params["permutation"] == (1, 0) and _is_var(source.invars[0]):
                    invars[k], dims[k] = source.invars[0], 1 - dims[k]
        if invars != eqn.invars:
            return _with_dims(eqn, invars, *dims)
    if eqn.primitive is lax.reshape_p and _is_row_major_reshape(eqn):
        source = producer.get(eqn.invars[0])
        if _is_row_major_reshape(source):  # a ravel and unravel: the original array
            (base,) = source.invars
            if base.aval == eqn.outvars[0].aval:
                return base
            return eqn.replace(invars=[base])
    if eqn.primitive is lax.transpose_p and eqn.params["permutation"] == (1, 0):
        source = producer.get(eqn.invars[0]) if _is_var(eqn.invars[0]) else None
        if _matrix_dims(source) == (0, 1) and uses[eqn.invars[0]] == 1:
            return _with_dims(source, source.invars[::-1], 1, 0, outvars=eqn.outvars)
    return eqn


def simplify(jaxpr: jcore.Jaxpr) -> jcore.Jaxpr:
    """``jaxpr`` with matrix products in canonical form (:func:`_canonical`), duplicate
    equations removed (their uses read the first copy) and the equations whose outputs
    nothing uses dropped (unless they have effects)."""
    alias: dict = {}
    producer: dict = {}
    uses = Counter(v for eqn in jaxpr.eqns for v in eqn.invars if _is_var(v))
    uses.update(v for v in jaxpr.outvars if _is_var(v))

    def resolve(v):
        return alias.get(v, v) if _is_var(v) else v

    def share(new, old):  # uses of ``new`` read ``old`` from here on
        alias[new] = old
        uses[old] += uses[new]

    seen: dict = {}
    eqns = []
    for eqn in jaxpr.eqns:
        eqn = eqn.replace(invars=[resolve(v) for v in eqn.invars])
        canonical = _canonical(eqn, producer, uses)
        if not isinstance(canonical, jcore.JaxprEqn):  # the equation is one of its operands
            share(eqn.outvars[0], canonical)
            continue
        eqn = canonical
        key = _cse_key(eqn, resolve)
        if key is not None and key in seen:
            for new, old in zip(eqn.outvars, seen[key], strict=True):
                share(new, old)
            continue
        if key is not None:
            seen[key] = eqn.outvars
        producer.update((v, eqn) for v in eqn.outvars)
        eqns.append(eqn)
    outvars = [resolve(v) for v in jaxpr.outvars]
    live = {v for v in outvars if _is_var(v)}
    kept = []
    for eqn in reversed(eqns):
        if eqn.effects or any(v in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(v for v in eqn.invars if _is_var(v))
    return jaxpr.replace(eqns=kept[::-1], outvars=outvars)


def _merge_key(eqn, position: int):
    """Equations with equal keys can share one product: the same operand at ``position``."""
    shared, other = eqn.invars[position], eqn.invars[1 - position]
    if shared.aval.size < MIN_SHARED_RATIO * other.aval.size:
        return None
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    other_bound = (rhs_contract, rhs_batch) if position == 0 else (lhs_contract, lhs_batch)
    if other.aval.ndim == sum(map(len, other_bound)):  # no free dimension: matrix-vector
        return None  # products stacked into an n = 2 matrix product measured slower (SOBA)
    params = tuple(sorted((k, _param_key(p)) for k, p in eqn.params.items()))
    return position, shared, other.aval.shape, other.aval.dtype, params


def _transposed_partners(jaxpr: jcore.Jaxpr) -> set:
    """``(a, shape)`` for every product that XLA may compute as ``a b`` transposed, ``b`` of
    that shape: a matrix product ``b^T a^T`` (left operand contracted on its leading axis,
    right on its trailing one; :func:`simplify` has folded explicit transposes into this
    form), or a product of ``a`` with a transpose that :func:`simplify` did not fold. Where
    ``b`` turns out to equal the other operand of another product with ``a`` (which the jaxpr
    may not show), XLA computes the two as one, and merging that other product away would
    cost a product. Products of ``a`` with an operand of that shape are left unmerged."""
    transposed = {eqn.outvars[0] for eqn in jaxpr.eqns if eqn.primitive is lax.transpose_p}
    partners = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive is lax.dot_general_p and all(map(_is_var, eqn.invars)):
            a, b = eqn.invars
            partners.update((x, y.aval.shape[::-1]) for x, y in ((a, b), (b, a)) if y in transposed)
            if _matrix_dims(eqn) == (0, 1):  # a^T b^T = (b a)^T
                partners.add((b, a.aval.shape))
    return partners


def loop_invariant(jaxpr: jcore.Jaxpr, invariant_inputs: Sequence[int]) -> set:
    """The variables of ``jaxpr`` (a loop body, or a call inside one) that depend only on its
    constants and on the inputs at positions ``invariant_inputs`` (the loop's constants)."""
    fixed = set(jaxpr.constvars)
    fixed.update(jaxpr.invars[i] for i in invariant_inputs if i < len(jaxpr.invars))
    for eqn in jaxpr.eqns:
        if not eqn.effects and all(v in fixed for v in eqn.invars if _is_var(v)):
            fixed.update(eqn.outvars)
    return fixed


def sub_invariants(eqn: jcore.JaxprEqn, fixed: set) -> dict[str, tuple[int, ...]]:
    """For each jaxpr parameter of a higher-order ``eqn``, the positions of its inputs that are
    loop-invariant: a loop's constants (``scan``, ``while``), or the operands that are
    invariant (``fixed``) in the jaxpr around ``eqn`` (calls, ``cond`` branches)."""
    params = eqn.params
    if eqn.primitive.name == "scan":
        return {"jaxpr": tuple(range(params["num_consts"]))}
    if eqn.primitive.name == "while":
        return {
            "body_jaxpr": tuple(range(params["body_nconsts"])),
            "cond_jaxpr": tuple(range(params["cond_nconsts"])),
        }
    operands = eqn.invars[1:] if eqn.primitive.name == "cond" else eqn.invars  # index first
    positions = tuple(k for k, v in enumerate(operands) if not _is_var(v) or v in fixed)
    return {name: positions for name in params}


def merge_groups(jaxpr: jcore.Jaxpr, fixed: set = frozenset()) -> list[Node]:
    """Groups (of two or more) of independent ``dot_general`` equations sharing an operand.

    ``fixed``: the loop-invariant variables (:func:`loop_invariant`). A product with only
    invariant operands joins only others like it: XLA hoists it out of the loop, and merged
    with a product that changes each iteration it would run every iteration again (AID's
    conjugate gradient: its HVPs' primal ``X W`` at the fixed point, 10% of a step)."""
    partners = _transposed_partners(jaxpr)
    producer: dict = {}
    ancestors: list[int] = []  # bit j of ancestors[i]: equation i depends on equation j
    open_groups: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        deps = 0
        for v in eqn.invars:
            if _is_var(v) and v in producer:
                deps |= ancestors[producer[v]] | (1 << producer[v])
        ancestors.append(deps)
        producer.update((v, i) for v in eqn.outvars)
        if eqn.primitive is not lax.dot_general_p:
            continue
        if not all(map(_is_var, eqn.invars)):
            continue
        a, b = eqn.invars
        if (a, b.aval.shape) in partners or (b, a.aval.shape) in partners:
            continue
        for position in (0, 1):
            key = _merge_key(eqn, position)
            if key is None:
                continue
            key = (*key, all(v in fixed for v in eqn.invars))
            groups = open_groups.setdefault(key, [])
            for members in groups:
                if not deps & sum(1 << m for m in members):
                    members.append(i)
                    break
            else:
                groups.append([i])
            break  # one position per equation: a product joins at most one group
    return [tuple(m) for groups in open_groups.values() for m in groups if len(m) > 1]


def schedule(jaxpr: jcore.Jaxpr, groups: Sequence[Node]) -> list[Node]:
    """An evaluation order of ``jaxpr``'s equations with each group as one node: a topological
    order, the original one where it can be. Without merges if the groups would make a cycle
    (each group is acyclic with the equations before it, not necessarily with other groups)."""
    node_of = {i: (i,) for i in range(len(jaxpr.eqns))}
    if not groups:  # nothing merged (or merging off): the jaxpr's own order
        return list(node_of.values())
    for group in groups:
        node_of.update((i, group) for i in group)
    producer = {v: node_of[i] for i, eqn in enumerate(jaxpr.eqns) for v in eqn.outvars}
    nodes = list(dict.fromkeys(node_of.values()))
    users: dict[Node, set[Node]] = {n: set() for n in nodes}
    waiting = {}
    for node in nodes:
        needs = {
            producer[v]
            for i in node
            for v in jaxpr.eqns[i].invars
            if _is_var(v) and v in producer and producer[v] != node
        }
        waiting[node] = len(needs)
        for need in needs:
            users[need].add(node)
    ready = [(node[0], node) for node in nodes if waiting[node] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for user in users[node]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (user[0], user))
    if len(order) != len(nodes):
        return [(i,) for i in range(len(jaxpr.eqns))]
    return order


def bind_merged(
    eqns: Sequence[jcore.JaxprEqn], read: Callable, barrier: bool, stack: Callable | None = None
) -> list:
    """The members' outputs from one product on their stacked other operands (axis 0 of the
    stack is a free dimension of the product; each output is one index of it). ``barrier``:
    an ``optimization_barrier`` on the product (see ``wide_dots``). ``stack``: makes
    the stack from the operands' variables (default: ``jnp.stack`` of their values)."""
    first = eqns[0]
    position = 0 if all(e.invars[0] is first.invars[0] for e in eqns) else 1
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = first.params["dimension_numbers"]
    others = [e.invars[1 - position] for e in eqns]
    stacked = stack(others) if stack is not None else jnp.stack([read(v) for v in others])

    def shift(dims):  # the stacked operand's dimensions move up by the new leading axis
        return tuple(d + 1 for d in dims)

    if position == 0:  # shared left operand: the stack's axis is the first right free dim
        dims = ((lhs_contract, shift(rhs_contract)), (lhs_batch, shift(rhs_batch)))
        operands = (read(first.invars[0]), stacked)
        lhs_free = first.invars[0].aval.ndim - len(lhs_contract) - len(lhs_batch)
        axis = len(lhs_batch) + lhs_free
    else:  # shared right operand: the stack's axis is the first left free dim
        dims = ((shift(lhs_contract), rhs_contract), (shift(lhs_batch), rhs_batch))
        operands = (stacked, read(first.invars[1]))
        axis = len(lhs_batch)
    with first.ctx.manager:
        product = lax.dot_general_p.bind(*operands, **dict(first.params, dimension_numbers=dims))
    if barrier:
        product = lax.optimization_barrier(product)
    return [lax.index_in_dim(product, k, axis, keepdims=False) for k in range(len(eqns))]
