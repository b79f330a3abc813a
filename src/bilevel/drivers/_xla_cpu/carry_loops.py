"""Loops and calls evaluated with narrow matrices carried transposed (``carry_layout``).

``carry_layout`` decides which loop carries have a transposed form (a "representation") and
how each equation's representation follows from its operands'; this module evaluates with
them, for the evaluator (``evaluate``):

* :class:`Representations`: the representations of an evaluation's variables, kept beside
  their values (:meth:`Representations.note` after each equation);
* :func:`bind_loop`: a ``scan`` or ``while`` rebuilt with some carries transposed, its body
  evaluated by the evaluator with its rewrites;
* :func:`inline_call`: a call evaluated inline, its inputs and outputs keeping their
  representations.

The values are those of the original up to floating-point summation order (a transpose moves
numbers; the elementwise operations are the same).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax.numpy as jnp
from jax import lax
from jax.extend import core as jcore

from bilevel.drivers._xla_cpu import carry_layout
from bilevel.drivers._xla_cpu.dot_merge import _is_var

__all__ = [
    "to_representation",
    "from_representation",
    "Representations",
    "Evaluate",
    "bind_loop",
    "inline_call",
]

Class = carry_layout.Class


def to_representation(value, cls: Class):
    """``transpose(reshape(value, (m, c)))``."""
    return lax.transpose(value.reshape(cls), (1, 0))


def from_representation(rep, cls: Class, shape: tuple[int, ...]):
    """The value a representation stands for, in ``shape``."""
    natural = lax.transpose(rep, (1, 0))
    return natural if tuple(shape) == cls else natural.reshape(shape)


class Representations:
    """The transposed forms of an evaluation's variables, beside their values: ``var ->
    (representation, class)``, and the uniform arrays ``var -> scalar``."""

    def __init__(self):
        self.reps: dict = {}
        self.uniforms: dict = {}

    def class_of(self, v) -> Class | None:
        entry = self.reps.get(v) if _is_var(v) else None
        return None if entry is None else entry[1]

    def set(self, var, rep, cls: Class) -> None:
        self.reps[var] = (rep, cls)

    def get(self, var, cls: Class):
        """``var``'s representation of class ``cls``, or None."""
        entry = self.reps.get(var)
        return entry[0] if entry is not None and entry[1] == cls else None

    def of(self, var, value, cls: Class):
        """``var``'s representation, computed from ``value`` where it has none."""
        rep = self.get(var, cls) if _is_var(var) else None
        return to_representation(value, cls) if rep is None else rep

    def note(self, eqn, read: Callable, write: Callable) -> None:
        """After ``eqn`` was evaluated: its output's representation, where
        ``carry_layout.rule`` gives one (``write`` replaces the output's value where the
        representation is that value). The value stays traced beside it; where nothing reads
        it, XLA drops it as dead code."""
        how = carry_layout.rule(eqn, self.class_of, self.uniforms.__contains__)
        if how is None:
            return
        kind, cls = how
        (out,) = eqn.outvars
        if isinstance(out, jcore.DropVar):
            return
        args = eqn.invars
        if kind == "uniform":
            self.uniforms[out] = read(args[0])
        elif kind == "alias":
            self.set(out, self.reps[args[0]][0], cls)
        elif kind == "wrap":
            self.set(out, read(args[0]), cls)
        elif kind == "unwrap":
            write([out], [self.reps[args[0]][0]])
        elif kind == "contract":
            reps = [self.reps[v][0] for v in args]
            params = dict(eqn.params, dimension_numbers=(((0, 1), (0, 1)), ((), ())))
            with eqn.ctx.manager:
                write([out], [eqn.primitive.bind(*reps, **eqn.primitive.get_bind_params(params))])
        elif kind == "reduce":
            rep = self.reps[args[0]][0]
            params = eqn.primitive.get_bind_params(dict(eqn.params, axes=(0, 1)))
            with eqn.ctx.manager:
                write([out], [eqn.primitive.bind(rep, **params)])
        else:  # elementwise
            operands = [self._operand(v, read, cls) for v in args]
            with eqn.ctx.manager:
                rep = eqn.primitive.bind(*operands, **eqn.primitive.get_bind_params(eqn.params))
            self.set(out, rep, cls)

    def stack(self, variables, *, read: Callable):
        """``jnp.stack`` of the variables' values, for a merged product
        (``dot_merge.bind_merged``): where each is a represented ``(m, c)``
        matrix, the transpose of the stack of their representations (a contiguous copy, and a
        transpose that XLA folds into the product) instead of a copy that transposes each."""
        if all(_is_var(v) and self.class_of(v) == v.aval.shape for v in variables):
            return lax.transpose(jnp.stack([self.reps[v][0] for v in variables]), (0, 2, 1))
        return jnp.stack([read(v) for v in variables])

    def _operand(self, v, read, cls: Class):
        if v.aval.ndim == 0:
            return read(v)
        if _is_var(v) and v in self.uniforms:
            scalar = self.uniforms[v]
            return lax.broadcast_in_dim(scalar, (cls[1], cls[0]), ())
        return self.reps[v][0]


#: ``evaluate(jaxpr, consts, args, invariant, rep_args, rep_outs) -> outputs``
Evaluate = Callable[..., list]


def bind_loop(
    eqn,
    carried: Mapping[int, Class],
    read: Callable,
    reps: Representations,
    evaluate: Evaluate,
    invariants: Mapping[str, tuple[int, ...]],
) -> list:
    """``eqn`` (a ``scan`` or ``while``) evaluated with the carries of ``carried`` transposed
    (their initial values as representations, taken from ``reps`` where there are some);
    returns the loop's outputs as values and records the carried outputs' representations
    in ``reps``. ``evaluate`` evaluates a body (the caller's evaluator, with its rewrites)."""
    params = eqn.params
    values = [read(v) for v in eqn.invars]
    scan = eqn.primitive.name == "scan"
    first = params["num_consts"] if scan else params["cond_nconsts"] + params["body_nconsts"]
    count = params["num_carry"] if scan else len(eqn.outvars)
    init = list(values[first : first + count])
    for k, cls in carried.items():
        init[k] = reps.of(eqn.invars[first + k], init[k], cls)
    shapes = [v.aval.shape for v in eqn.outvars[:count]]
    run = _run_scan if scan else _run_while
    outs = run(params, values, init, carried, shapes, evaluate, invariants)
    for k, cls in carried.items():
        reps.set(eqn.outvars[k], outs[k], cls)
        outs[k] = from_representation(outs[k], cls, shapes[k])
    return outs


def _run_scan(params, values, init, carried, shapes, evaluate, invariants) -> list:
    """:func:`bind_loop` for a ``scan``: its carries and stacked outputs."""
    body, first, count = params["jaxpr"], params["num_consts"], len(init)
    consts, xs = values[:first], values[first + count :]
    rep_args = {first + k: cls for k, cls in carried.items()}

    def step(carry, x):
        args = [*consts, *carry, *x]
        outs = evaluate(
            body.jaxpr, body.consts, args, invariants.get("jaxpr", ()), rep_args, carried
        )
        return outs[:count], outs[count:]

    options = {name: params[name] for name in ("length", "reverse", "unroll")}
    carry, ys = lax.scan(step, init, xs, **options)
    return [*carry, *ys]


def _run_while(params, values, init, carried, shapes, evaluate, invariants) -> list:
    """:func:`bind_loop` for a ``while``: its carries (the condition reads them as values)."""
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    split = params["cond_nconsts"]
    cond_consts, body_consts = values[:split], values[split : split + params["body_nconsts"]]
    rep_args = {params["body_nconsts"] + k: cls for k, cls in carried.items()}

    def cond_fun(carry):
        real = [
            from_representation(c, carried[k], shapes[k]) if k in carried else c
            for k, c in enumerate(carry)
        ]
        args = [*cond_consts, *real]
        return evaluate(cond.jaxpr, cond.consts, args, invariants.get("cond_jaxpr", ()))[0]

    def body_fun(carry):
        args = [*body_consts, *carry]
        invariant = invariants.get("body_jaxpr", ())
        return evaluate(body.jaxpr, body.consts, args, invariant, rep_args, carried)

    return list(lax.while_loop(cond_fun, body_fun, init))


def inline_call(
    eqn, read: Callable, reps: Representations, evaluate: Evaluate, invariant: tuple[int, ...]
) -> list | None:
    """A call equation evaluated inline, its represented inputs passed as representations and
    its represented outputs (``carry_layout.call_classes``) recorded in ``reps``; None
    (evaluate it as usual) where no input or output is represented."""
    closed = carry_layout.call_jaxpr(eqn)
    given = carry_layout.input_classes(eqn, reps.class_of)
    wanted = carry_layout.flow(closed.jaxpr, given)
    if not given and not wanted:
        return None
    args = [reps.reps[v][0] if k in given else read(v) for k, v in enumerate(eqn.invars)]
    outs = evaluate(closed.jaxpr, closed.consts, args, invariant, given, wanted)
    for k, cls in wanted.items():
        reps.set(eqn.outvars[k], outs[k], cls)
        outs[k] = from_representation(outs[k], cls, eqn.outvars[k].aval.shape)
    return outs
