"""Re-trace a jaxpr with the CPU rewrites applied: the evaluator the rewrites plug into.

:func:`rewrite_jaxpr` evaluates a program's jaxpr equation by equation (as
``jax.core.eval_jaxpr`` does) inside ``jax.make_jaxpr``, so the result is a new jaxpr with the
same input and output types. On the way it applies the rewrites that its
:class:`~bilevel.drivers.cpu_rewrites.CpuRewrites` options name:

* ``wide_dots``: an ``optimization_barrier`` after each wide, transposed product (``wide_dots``);
* ``merge_dots``: each jaxpr simplified, and the products that share an operand evaluated as
  one, in a schedule that keeps the jaxpr's dependencies (``dot_merge``);
* ``carry_layout``: loops carrying narrow matrices transposed, with the transposed forms
  followed through the equations around them (``carry_layout``, ``carry_loops``);
* ``small_dots``: small products as a multiply and a sum (``small_dots``);
* ``unrolled_keys``: key splits and random bits as straight-line Threefry (``unrolled_keys``).

Every jaxpr-valued parameter of an equation (``jax.extend.core.jaxprs_in_params``: the bodies
of ``scan`` and ``while``, the branches of ``cond``, the callee of ``jit``, the body of
``jax.checkpoint`` (primitive ``remat2`` in JAX 0.10), custom-derivative calls, ...) is
rewritten the same way, so no primitive is missed for want of a name in a list.

Each rewrite runs under :func:`blame`: an exception it raises becomes a :class:`RewriteError`
naming it, so the caller (:func:`bilevel.drivers._xla_cpu.rewrite`) can rewrite the program
again with that one rewrite off. An exception outside any rewrite (the evaluator's own
re-binding) is a :class:`RewriteError` naming none: the program is then left as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import jax
from jax.extend import core as jcore

from bilevel.drivers._xla_cpu import (
    carry_layout,
    carry_loops,
    dot_merge,
    small_dots,
    unrolled_keys,
    wide_dots,
)
from bilevel.drivers.cpu_rewrites import CpuRewrites

__all__ = ["RewriteError", "blame", "Scope", "Rewriter", "rewrite_jaxpr"]


class RewriteError(Exception):
    """The rewrite ``name`` (a :class:`CpuRewrites` field; None for the evaluator itself)
    raised ``cause`` while rewriting a program."""

    def __init__(self, name: str | None, cause: BaseException):
        super().__init__(f"{name or 'evaluator'}: {type(cause).__name__}: {cause}")
        self.name = name
        self.cause = cause


@contextlib.contextmanager
def blame(name: str | None) -> Iterator[None]:
    """Report any exception raised inside as a :class:`RewriteError` of ``name`` (one raised
    by a rewrite further in keeps its own name)."""
    try:
        yield
    except RewriteError:
        raise
    except Exception as err:  # noqa: BLE001  (re-raised, with the rewrite it came from)
        raise RewriteError(name, err) from err


@dataclasses.dataclass(frozen=True)
class Scope:
    """What the surroundings of a jaxpr give it and want from it.

    Attributes:
        invariant: the positions of its inputs that are constants of an enclosing loop
            (``dot_merge`` leaves their products unmerged with the others).
        rep_args: the positions of the inputs given transposed, with their classes
            (``carry_layout``).
        rep_outs: the positions of the outputs wanted transposed, with their classes.
    """

    invariant: tuple[int, ...] = ()
    rep_args: Mapping[int, carry_layout.Class] = dataclasses.field(default_factory=dict)
    rep_outs: Mapping[int, carry_layout.Class] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How one jaxpr is evaluated: the jaxpr (simplified where merging is on), its variables
    that are loop-invariant (``dot_merge.loop_invariant``), the order of its equations (merged
    groups as one node) and the variables some equation transposes (``wide_dots``)."""

    jaxpr: jcore.Jaxpr
    fixed: frozenset
    order: list[tuple[int, ...]]
    transposed: frozenset


class Rewriter:
    """Evaluates the jaxprs of one program with the rewrites ``options`` selects."""

    def __init__(self, options: CpuRewrites):
        self.options = options

    def evaluate(
        self,
        jaxpr: jcore.Jaxpr,
        consts,
        args,
        invariant: tuple[int, ...] = (),
        rep_args: Mapping[int, carry_layout.Class] | None = None,
        rep_outs: Mapping[int, carry_layout.Class] | None = None,
    ) -> list:
        """The outputs of ``jaxpr`` on ``args``, rewritten (``carry_loops.Evaluate``: the
        signature the loops of ``carry_loops`` call their bodies with; :class:`Scope`)."""
        scope = Scope(tuple(invariant), rep_args or {}, rep_outs or {})
        return _Frame(self, jaxpr, consts, args, scope).run()

    def rewrite_params(self, params: Mapping[str, Any], invariants: Mapping) -> dict:
        """An equation's parameters with every jaxpr among them rewritten (``invariants``:
        the loop-invariant input positions of each, by parameter name)."""
        return {
            name: self._param(value, invariants.get(name, ())) for name, value in params.items()
        }

    def _param(self, value, invariant: tuple[int, ...]):
        if isinstance(value, jcore.ClosedJaxpr):
            return self.rewrite_closed(value, invariant)
        if isinstance(value, jcore.Jaxpr):
            return self._rewrite_open(value, invariant)
        if isinstance(value, tuple) and any(
            isinstance(v, jcore.ClosedJaxpr | jcore.Jaxpr) for v in value
        ):
            items = [self._param(v, invariant) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
        return value

    def rewrite_closed(
        self, closed: jcore.ClosedJaxpr, invariant: tuple[int, ...] = ()
    ) -> jcore.ClosedJaxpr:
        """``closed`` re-traced through :meth:`evaluate`, with the same input and output
        types (a TypeError where they changed)."""
        avals = closed.in_avals
        structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]

        def evaluate(*args):
            return self.evaluate(closed.jaxpr, closed.consts, args, invariant)

        new = jax.make_jaxpr(evaluate)(*structs)
        if new.in_avals != avals or _types(new.out_avals) != _types(closed.out_avals):
            raise TypeError("the re-traced jaxpr changed its input or output types")
        return new

    def _rewrite_open(self, jaxpr: jcore.Jaxpr, invariant: tuple[int, ...]) -> jcore.Jaxpr:
        """An open jaxpr parameter (the body of ``jax.checkpoint``) rewritten; as it was where
        the rewritten one would need constants (new operands of its equation, which only its
        own primitive knows how to pass)."""
        if jaxpr.constvars:
            return jaxpr
        new = self.rewrite_closed(jcore.ClosedJaxpr(jaxpr, ()), invariant)
        return jaxpr if new.consts else new.jaxpr


def _types(avals) -> list:
    return [(a.shape, a.dtype) for a in avals]


class _Frame:
    """The evaluation of one jaxpr: its variables' values, their transposed forms
    (``carry_loops.Representations``) and its plan."""

    def __init__(self, rewriter: Rewriter, jaxpr: jcore.Jaxpr, consts, args, scope: Scope):
        self.rewriter = rewriter
        self.options = rewriter.options
        self.jaxpr = jaxpr
        self.scope = scope
        self.env: dict[Any, Any] = {}
        self.reps = carry_loops.Representations()
        self.env.update(zip(jaxpr.constvars, consts, strict=True))
        self.env.update(zip(jaxpr.invars, args, strict=True))
        with blame("carry_layout"):
            for position, cls in scope.rep_args.items():
                var = jaxpr.invars[position]
                self.reps.set(var, args[position], cls)
                self.env[var] = carry_loops.from_representation(args[position], cls, var.aval.shape)

    def read(self, v):
        return v.val if isinstance(v, jcore.Literal) else self.env[v]

    def write(self, outvars, values) -> None:
        for var, value in zip(outvars, values, strict=True):
            if not isinstance(var, jcore.DropVar):
                self.env[var] = value

    def run(self) -> list:
        """The jaxpr's outputs (those ``scope.rep_outs`` names as their transposed forms)."""
        with blame(None):
            plan = self._plan()
            for node in plan.order:
                eqns = [plan.jaxpr.eqns[i] for i in node]
                if len(eqns) > 1:
                    self._bind_group(eqns, plan)
                else:
                    self._bind_equation(eqns[0], plan)
            outs = [self.read(v) for v in plan.jaxpr.outvars]
        with blame("carry_layout"):
            for position, cls in self.scope.rep_outs.items():
                outs[position] = self.reps.of(plan.jaxpr.outvars[position], outs[position], cls)
        return outs

    def _plan(self) -> _Plan:
        jaxpr, fixed, order = self.jaxpr, frozenset(), None
        if self.options.merge_dots:
            with blame("merge_dots"):
                jaxpr = dot_merge.simplify(jaxpr)
                fixed = frozenset(dot_merge.loop_invariant(jaxpr, self.scope.invariant))
                order = dot_merge.schedule(jaxpr, dot_merge.merge_groups(jaxpr, fixed))
        if order is None:
            order = [(i,) for i in range(len(jaxpr.eqns))]
        transposed = frozenset()
        if self.options.wide_dots:
            with blame("wide_dots"):
                transposed = frozenset(wide_dots.transposed_vars(jaxpr))
        return _Plan(jaxpr, fixed, order, transposed)

    def _bind_group(self, eqns: list, plan: _Plan) -> None:
        """Products that share an operand, as one (``dot_merge.bind_merged``)."""
        with blame("wide_dots"):
            barrier = any(wide_dots.needs_barrier(e, plan.transposed) for e in eqns)
        stack = self._stack if self.options.carry_layout else None
        with blame("merge_dots"):
            outs = dot_merge.bind_merged(eqns, self.read, barrier, stack)
        self.write([e.outvars[0] for e in eqns], outs)

    def _stack(self, variables):
        with blame("carry_layout"):
            return self.reps.stack(variables, read=self.read)

    def _bind_equation(self, eqn: jcore.JaxprEqn, plan: _Plan) -> None:
        params = eqn.params
        if any(True for _ in jcore.jaxprs_in_params(params)):
            invariants = {}
            if self.options.merge_dots:
                with blame("merge_dots"):
                    invariants = dot_merge.sub_invariants(eqn, plan.fixed)
            if self.options.carry_layout and self._bind_transposed(eqn, invariants):
                return
            params = self.rewriter.rewrite_params(params, invariants)
        bind_params = eqn.primitive.get_bind_params(params)
        with eqn.ctx.manager:
            outs = self._apply(eqn, bind_params)
        if not eqn.primitive.multiple_results:
            outs = [outs]
        if self.options.wide_dots:
            with blame("wide_dots"):
                if wide_dots.needs_barrier(eqn, plan.transposed):
                    outs = [wide_dots.barrier(outs[0])]
        self.write(eqn.outvars, outs)
        if self.options.carry_layout:
            with blame("carry_layout"):
                self.reps.note(eqn, self.read, self.write)

    def _apply(self, eqn: jcore.JaxprEqn, bind_params: dict):
        """The equation's value: a small product as multiply-reduce, a key split or draw
        written out, anything else bound as it is."""
        args = [self.read(v) for v in eqn.invars]
        if self.options.small_dots:
            with blame("small_dots"):
                if small_dots.keep_small(eqn):
                    return small_dots.multiply_reduce(*args, **bind_params)
        if self.options.unrolled_keys:
            with blame("unrolled_keys"):
                if args and unrolled_keys.applies(eqn, args[0]):
                    return unrolled_keys.evaluate(eqn, args[0])
        return eqn.primitive.bind(*args, **bind_params)

    def _bind_transposed(self, eqn: jcore.JaxprEqn, invariants: Mapping) -> bool:
        """A loop with some carries transposed, or a call evaluated inline so that its inputs
        and outputs keep their transposed forms (``carry_layout``); False where neither
        applies (the equation is then evaluated as usual)."""
        evaluate = self.rewriter.evaluate
        with blame("carry_layout"):
            outs = None
            if eqn.primitive.name in ("scan", "while"):
                carried = carry_layout.loop_carries(eqn)
                if carried:
                    outs = carry_loops.bind_loop(
                        eqn, carried, self.read, self.reps, evaluate, invariants
                    )
            elif carry_layout.call_jaxpr(eqn) is not None:
                invariant = invariants.get(carry_layout.CALLS[eqn.primitive.name], ())
                outs = carry_loops.inline_call(eqn, self.read, self.reps, evaluate, invariant)
        if outs is None:
            return False
        self.write(eqn.outvars, outs)
        return True


def rewrite_jaxpr(closed: jcore.ClosedJaxpr, options: CpuRewrites) -> jcore.ClosedJaxpr:
    """``closed`` (a whole program) rewritten as ``options`` say: a new closed jaxpr with the
    same input and output types. Raises :class:`RewriteError` naming the rewrite that failed
    (None: the evaluator), or TypeError where the types changed."""
    carry_layout.forget()  # loop decisions are per program (and hold its jaxprs)
    try:
        return Rewriter(options).rewrite_closed(closed)
    finally:
        carry_layout.forget()
