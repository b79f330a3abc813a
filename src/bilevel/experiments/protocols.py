"""Protocols of the reproductions: every setting of a run with where it comes from.

A reproduction's headline run is its *paper protocol*: the step sizes, scalings, iteration
counts, schedules and tuning rules the paper states, each value carrying its source (the
paper's section or equation, or the authors' public code where the paper leaves it open), and
"our choice" where neither says. A second protocol (one tuning grid for all methods, another
scaling, more starts) may run beside it under its own name; every claim names the protocol it
was judged on (``Claim.protocol``), and ``claims.md`` lists each protocol's settings with their
sources, so a verdict can always be traced to what was run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["Sourced", "Protocol", "OURS", "PAPER"]

#: the source of a value neither the paper nor the authors' code gives
OURS = "our choice"
#: the name of the headline protocol, the one the paper's claims are judged on
PAPER = "paper"


@dataclasses.dataclass(frozen=True)
class Sourced:
    """A setting's value and its source: ``"<paper>, Sec. 4"``, ``"authors' code: <file>"``, or
    :data:`OURS`."""

    value: Any
    source: str

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"Sourced({self.value!r}, ...) needs a source (or OURS).")


@dataclasses.dataclass(frozen=True)
class Protocol:
    """A named set of settings, each :class:`Sourced`.

    ``protocol["lr_outer"]`` is the value; ``protocol.source("lr_outer")`` where it comes from.
    """

    name: str
    description: str
    settings: Mapping[str, Sourced]

    def __post_init__(self) -> None:
        for key, setting in self.settings.items():
            if not isinstance(setting, Sourced):
                raise TypeError(f"Protocol {self.name!r}: setting {key!r} is not Sourced.")

    def __getitem__(self, key: str) -> Any:
        return self.settings[key].value

    def source(self, key: str) -> str:
        return self.settings[key].source

    def values(self) -> dict[str, Any]:
        """The plain values, by name."""
        return {key: s.value for key, s in self.settings.items()}

    def as_run(self, values: Mapping[str, Any], why: str) -> Protocol:
        """This protocol with the ``values`` a run changed in place, each sourced as ``why``
        and giving the protocol's value; itself when the run changed nothing."""
        changed = {
            key: Sourced(values[key], f"{why} (protocol: {setting.value})")
            for key, setting in self.settings.items()
            if values[key] != setting.value
        }
        if not changed:
            return self
        return Protocol(self.name, self.description, {**self.settings, **changed})

    def run_values(
        self, quick: bool, quick_values: Mapping[str, Any], seeds: int | None = None
    ) -> dict[str, Any]:
        """The values a run uses: this protocol's, with ``quick_values`` in place in a quick
        run and the command line's ``seeds`` (as ``"seeds"``) when given."""
        values = self.values()
        if quick:
            values.update(quick_values)
        if seeds is not None:
            values["seeds"] = seeds
        return values

    def markdown(self) -> list[str]:
        """A ``claims.md`` section: the description, then a table of value and source."""
        lines = [f"### Protocol `{self.name}`", "", self.description, ""]
        lines += ["| setting | value | source |", "|---|---|---|"]
        for key, s in self.settings.items():
            value = f"{s.value:.4g}" if isinstance(s.value, float) else str(s.value)
            cells = [key, value, s.source]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        return lines + [""]
