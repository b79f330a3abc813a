"""A griffe extension for the documentation site (``mkdocs.yml`` loads it): the docstrings of
``bilevel`` are Google style but use a few reStructuredText idioms, which Markdown would show
raw. This rewrites them as Markdown when the API reference reads them:

- roles such as ``:func:`step_size``` and ``:class:`~bilevel.meta.heads.Head``` become code
  spans (``step_size``, ``Head``: a leading ``~`` keeps the last component, as in Sphinx);
- a paragraph ending in ``::`` (reStructuredText's "a literal block follows") ends in ``:``,
  and a line holding only ``::`` is dropped; the indented block after it is already a Markdown
  code block, and is left as it is;
- a star of a formula (``y*(x)``, ``F(x*)``) is escaped, so that Markdown does not read two of
  them as an emphasis; code spans and emphasis (``*same*``) are left alone.

The docstrings themselves are not changed (``help()`` and the terminal keep the original).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _role(match: re.Match) -> str:
    tilde, target = match.groups()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


# code spans, possibly over several lines of one paragraph (kept as they are), and emphasis
# ``*word*`` / ``**word**`` (kept too)
_CODE = re.compile(r"(`+)(?:(?!\n[ \t]*\n).)+?\1", re.S)
_EMPHASIS = re.compile(r"(?<![\w*\\])\*{1,2}(?=[A-Za-z])[^*\n]*?(?<=[\w.])\*{1,2}(?![\w*])")
# a star right after a name or a bracket, as in ``y*(x)``, ``x*``, ``F(x*)``: mathematics, which
# Markdown would take for the start or end of an emphasis
_MATH_STAR = re.compile(r"(?<=[\w)\]])\*+")  # and a power, ``T**-0.4``


def _escaped(match: re.Match) -> str:
    return "\\*" * len(match.group(0))


def _escape_stars(text: str) -> str:
    """``text`` with its mathematical stars escaped, outside code spans and emphasis."""
    out, at = [], 0
    for match in _CODE.finditer(text):
        out += [_escape_outside_emphasis(text[at : match.start()]), match.group(0)]
        at = match.end()
    return "".join([*out, _escape_outside_emphasis(text[at:])])


def _escape_outside_emphasis(text: str) -> str:
    out, at = [], 0
    for match in _EMPHASIS.finditer(text):
        out += [_MATH_STAR.sub(_escaped, text[at : match.start()]), match.group(0)]
        at = match.end()
    return "".join([*out, _MATH_STAR.sub(_escaped, text[at:])])


def _literal_lines(lines: list[str]) -> list[bool]:
    """Which lines are literal blocks, left as they are: the lines indented under a line ending
    in ``::``, and a block indented by 4 or more after a blank line (a Markdown code block)."""
    literal = [False] * len(lines)
    block = None  # the indentation of the text a literal block hangs from
    text_indent, blank_before = None, False
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if block is not None:
            if not line.strip() or indent > block:
                literal[i] = True
                continue
            block = None
        if line.strip() and blank_before and text_indent is not None:
            if indent >= text_indent + 4:
                block, literal[i] = text_indent, True
                continue
        if line.rstrip().endswith("::"):
            block = indent
        if line.strip():
            text_indent = indent
        blank_before = not line.strip()
    return literal


def markdown(text: str) -> str:
    """``text`` (a docstring) with its reStructuredText roles and ``::`` markers rewritten and
    the stars of its formulas (``y*(x)``) escaped; literal blocks are left as they are."""
    lines = text.split("\n")
    literal = _literal_lines(lines)
    out, prose = [], []

    def flush():
        if prose:
            out.append(_escape_stars(_ROLE.sub(_role, "\n".join(prose))))
            prose.clear()

    for line, is_literal in zip(lines, literal, strict=True):
        if is_literal:
            flush()
            out.append(line)
            continue
        stripped = line.rstrip()
        if stripped.endswith("::"):
            if not stripped.strip(": "):
                continue  # a line holding only "::"
            line = stripped[:-1]
        prose.append(line)
    flush()
    return "\n".join(out)


class RstRoles(griffe.Extension):
    """Rewrite every docstring's roles and literal-block markers (see the module docstring)."""

    # on_instance (each object as it is created) rather than on_object (griffe >= 1), which
    # the oldest griffe the docs extra allows lacks
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
