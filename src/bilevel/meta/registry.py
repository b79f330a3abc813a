"""The meta-learner registry: ``make(name, **hyperparameters)``, ``names()`` and ``register``.

A name maps to a learner class (a frozen dataclass following :mod:`bilevel.meta.base`) and
hyperparameters the name fixes: ``"fomaml"`` is ``MAML`` with ``first_order=True``.

    >>> from bilevel.meta import registry
    >>> registry.make("fomaml", inner_steps=1).first_order
    True
"""

from __future__ import annotations

import difflib
from typing import Any

from bilevel.meta.maml import ANIL, MAML
from bilevel.meta.protonet import ProtoNet
from bilevel.meta.pzobo import PZOBOMeta
from bilevel.solvers.registry import check_hyperparameters

__all__ = ["register", "make", "names"]

_REGISTRY: dict[str, tuple[type, dict[str, Any]]] = {}


def register(name: str, cls: type, **fixed: Any) -> type:
    """Register learner class ``cls`` under the lower-case ``name``, with the hyperparameters
    ``fixed`` that the name implies (``register("fomaml", MAML, first_order=True)``).

    Returns ``cls``. Raises a ValueError if ``name`` is taken by another entry, or if
    ``fixed`` names a field ``cls`` does not have.
    """
    key = name.lower()
    entry = (cls, dict(fixed))
    if key in _REGISTRY and _REGISTRY[key] != entry:
        raise ValueError(f"meta-learner name {key!r} is already registered.")
    check_hyperparameters(cls, key, fixed)
    _REGISTRY[key] = entry
    return cls


def names() -> list[str]:
    """The registered meta-learner names, sorted."""
    return sorted(_REGISTRY)


def make(name: str, **hyperparameters: Any):
    """The learner ``name`` with ``hyperparameters`` (the others keep their defaults).

    Raises:
        ValueError: an unknown name (with close matches), a hyperparameter the learner does
            not have (the message lists those it has), one the name fixes (``"fomaml"``'s
            ``first_order``), or a bad value.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in _REGISTRY:
        close = difflib.get_close_matches(str(key), _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown meta-learner {name!r}.{hint} Known: {', '.join(names())}.")
    cls, fixed = _REGISTRY[key]
    check_hyperparameters(cls, key, hyperparameters)
    clash = sorted(set(fixed) & set(hyperparameters))
    if clash:
        raise ValueError(
            f"meta-learner {key!r} fixes {', '.join(f'{k}={fixed[k]!r}' for k in clash)}; "
            "leave it out, or pick the name registered with the value you want."
        )
    return cls(**fixed, **hyperparameters)


register("pzobo", PZOBOMeta)
register("maml", MAML)
register("fomaml", MAML, first_order=True)
register("anil", ANIL)
register("protonet", ProtoNet)
