"""Where datasets are looked for (private helpers shared by the loaders)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Environment variable naming a data root. Loaders look in a per-dataset
#: subdirectory of it: ``$BILEVEL_DATA/mnist``, ``$BILEVEL_DATA/fashion-mnist``,
#: ``$BILEVEL_DATA/libsvm``.
DATA_ENV_VAR = "BILEVEL_DATA"

#: Environment variable that, set to ``1``, makes every loader ignore data that is there only
#: because of an install on this machine: system-wide locations (``/usr/share/datasets/...``,
#: e.g. the Debian package ``dataset-fashion-mnist``) and scikit-learn's download cache (20
#: Newsgroups). ``$BILEVEL_DATA`` and explicit ``path=`` arguments still work. Why: to check
#: on a machine that has such data what a machine without it does (which stand-in an
#: experiment takes, what its outputs say), as the tests do.
IGNORE_SYSTEM_ENV_VAR = "BILEVEL_IGNORE_SYSTEM_DATA"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def data_root() -> Path | None:
    """Return ``$BILEVEL_DATA`` as a path, or ``None`` when unset or empty."""
    value = os.environ.get(DATA_ENV_VAR, "").strip()
    return Path(value).expanduser() if value else None


def env_flag(name: str, meaning: str) -> bool:
    """Read a yes/no environment variable: ``1`` / ``true`` / ``yes`` / ``on`` or unset / ``0`` /
    ``false`` / ``no`` / ``off`` / empty (case-insensitive).

    Any other value is an error rather than a guess: a misspelt value silently read as "no"
    could, say, load the very data the user meant to hide. ``meaning`` completes "use 1 to ..."
    in that error.
    """
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"${name}={os.environ[name]!r} is not understood; use 1 to {meaning} (or 0 / unset not to)."
    )


def system_data_ignored() -> bool:
    """Whether ``$BILEVEL_IGNORE_SYSTEM_DATA`` asks loaders to skip machine-wide data
    (:func:`env_flag`)."""
    return env_flag(IGNORE_SYSTEM_ENV_VAR, "ignore system-wide data")


def candidate_dirs(
    path: str | os.PathLike[str] | None, subdir: str, fallbacks: Iterable[Path] = ()
) -> list[Path]:
    """Directories to search, in order.

    An explicit ``path`` is authoritative: when given, it is the only directory
    searched. Falling back to other locations would silently load a different
    copy of the data than the one the caller asked for (and would make "file
    missing" impossible to test on a machine that has a system-wide copy).
    Without ``path``: ``$BILEVEL_DATA/<subdir>`` (if the variable is set), then
    the ``fallbacks`` (system-wide locations such as a Debian package's), unless
    ``$BILEVEL_IGNORE_SYSTEM_DATA`` is set (:func:`system_data_ignored`).
    """
    if path is not None:
        return [Path(path).expanduser()]
    dirs: list[Path] = []
    root = data_root()
    if root is not None:
        dirs.append(root / subdir)
    if not system_data_ignored():
        dirs.extend(fallbacks)
    return dirs


def find_first(directory: Path, names: Sequence[str]) -> Path | None:
    """Return the first of ``names`` that is a regular file in ``directory``."""
    for name in names:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    return None


def describe_searched(
    dirs: Sequence[Path], subdir: str, *, explicit: bool, fallbacks: Iterable[Path] = ()
) -> str:
    """Human-readable list of searched directories for error messages.

    ``explicit`` says whether the caller passed ``path=`` (then the environment
    variables were not consulted and are not mentioned). System-wide ``fallbacks``
    skipped because of ``$BILEVEL_IGNORE_SYSTEM_DATA`` are listed as skipped, so a
    user who forgot the variable is set sees why installed data was not found.
    """
    lines = [f"  - {d}" + ("" if d.is_dir() else " (does not exist)") for d in dirs]
    if not explicit and data_root() is None:
        # The environment variable comes first in the search order.
        lines.insert(0, f"  - ${DATA_ENV_VAR}/{subdir} (${DATA_ENV_VAR} is not set)")
    if not explicit and system_data_ignored():
        lines.extend(f"  - {d} (skipped: ${IGNORE_SYSTEM_ENV_VAR} is set)" for d in fallbacks)
    return "\n".join(lines) if lines else "  (nothing)"
