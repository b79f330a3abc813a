"""Reader for svmlight / LIBSVM text files and loaders for a few LIBSVM datasets.

File format (Joachims' SVM-light; Chang & Lin, "LIBSVM: a library for support
vector machines", ACM TIST 2011), one example per line::

    <label> <index>:<value> <index>:<value> ...   # optional comment

Indices are one-based and missing features are zero. Everything after ``#`` is a
comment and blank lines are skipped. Files may be plain, bzip2- or
gzip-compressed (detected from the content).

The datasets are those of the "LIBSVM Data: Classification (Binary Class)" page
(https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html) under the
names ``ijcnn1``, ``covtype.binary`` and ``australian``. Nothing here downloads
them; see :func:`load_libsvm_dataset` for where they are looked for.
"""

from __future__ import annotations

import bz2
import gzip
import os
import re
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import numpy as np

from bilevel.data._paths import DATA_ENV_VAR, candidate_dirs, describe_searched, find_first
from bilevel.data.errors import DataFormatError, DatasetNotFoundError

__all__ = ["LIBSVM_DATASETS", "load_libsvm_dataset", "read_libsvm", "read_libsvm_entries"]

LIBSVM_PAGE = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html"

# A whole line once the comment is removed: a label token without colon, then
# index:value pairs with a decimal index and a non-empty value. Numbers themselves
# are checked when numpy converts them.
_LINE_RE = re.compile(r"\s*[^\s:]+(?:\s+\d+:[^\s:]+)*\s*", re.ASCII)
# Indices are parsed as float64 (exact below 2**53); far larger than any dense
# matrix could hold anyway.
_MAX_INDEX = 2**31 - 1

_MAX_SHOWN = 200  # characters of an offending line quoted in error messages


@contextmanager
def _open_binary(path: Path) -> Iterator[IO[bytes]]:
    """Open ``path`` for binary reading, decompressing bzip2 or gzip by content."""
    with path.open("rb") as probe:
        head = probe.read(3)
    if head[:2] == b"\x1f\x8b":
        stream: IO[bytes] = gzip.open(path, "rb")
    elif head == b"BZh":
        stream = bz2.open(path, "rb")
    else:
        stream = path.open("rb")
    with stream:
        yield stream


def _shown(line: str) -> str:
    text = line.rstrip("\r\n")
    if len(text) > _MAX_SHOWN:
        text = text[:_MAX_SHOWN] + "..."
    return repr(text)


def _line_error(path: Path, lineno: int, line: str, problem: str) -> DataFormatError:
    return DataFormatError(f"{path}, line {lineno}: {problem}: {_shown(line)}")


def _diagnose(tokens: list[str]) -> str:
    """Say what is wrong with a non-blank line rejected by ``_LINE_RE``."""
    if ":" in tokens[0]:
        return f"missing label (the line starts with {tokens[0]!r})"
    for token in tokens[1:]:
        idx, sep, value = token.partition(":")
        if not sep or not idx or not value or ":" in value:
            return f"feature {token!r} is not of the form index:value"
        if not (idx.isascii() and idx.isdigit()):
            return f"feature index {idx!r} is not a non-negative integer"
    return "cannot parse line"  # not reached for lines rejected by _LINE_RE


def _first_bad_number(path: Path, bodies: list[str], linenos: list[int]) -> DataFormatError:
    """Locate a token that numpy failed to parse, with Python's float (slow path)."""
    for body, lineno in zip(bodies, linenos, strict=True):
        tokens = body.split()
        if not _is_float(tokens[0]):
            return _line_error(path, lineno, body, f"label {tokens[0]!r} is not a number")
        for token in tokens[1:]:
            value = token.partition(":")[2]
            if not _is_float(value):
                return _line_error(path, lineno, body, f"feature value {value!r} is not a number")
    return DataFormatError(f"{path}: could not parse the numbers in this file")


@dataclass
class _Parsed:
    labels: np.ndarray  # float64 (n,)
    counts: np.ndarray  # int64 (n,) entries per row
    cols: np.ndarray  # int64 (nnz,) raw indices as written in the file
    vals: np.ndarray  # float64 (nnz,)
    linenos: np.ndarray  # int64 (n,) line number of each row


def _parse(path: Path) -> _Parsed:
    # Two passes for speed: Python only checks each line's structure with one
    # regex (C) and counts its features; numpy then converts all numbers of the
    # file in one np.fromstring call, about twice as fast as float() per token.
    # A number numpy cannot read sends us to a slow pass that names the line.
    bodies: list[str] = []
    counts: list[int] = []
    linenos: list[int] = []
    lineno = 0
    try:
        with _open_binary(path) as raw:
            # Decoding line by line (not through a TextIOWrapper, which decodes
            # ahead in chunks) keeps the line number of a decoding error exact.
            # Splitting on b"\n" handles "\r\n" too: "\r" is whitespace below.
            for lineno, raw_line in enumerate(raw, 1):
                line = raw_line.decode("utf-8")
                body = line.partition("#")[0] if "#" in line else line
                if _LINE_RE.fullmatch(body) is None:
                    if body.isspace() or not body:
                        continue  # blank or comment-only line
                    raise _line_error(path, lineno, line, _diagnose(body.split()))
                bodies.append(body)
                counts.append(body.count(":"))
                linenos.append(lineno)
    except UnicodeDecodeError as exc:
        raise DataFormatError(
            f"{path}, line {lineno}: not UTF-8/ASCII text ({exc.reason}); "
            "is this an svmlight/LIBSVM file?"
        ) from exc
    except (EOFError, OSError, zlib.error) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise DataFormatError(
            f"{path}: corrupt or truncated compressed stream after line {lineno} ({exc})"
        ) from exc

    n_rows = len(bodies)
    counts_arr = np.asarray(counts, dtype=np.int64)
    flat = np.zeros(0, dtype=np.float64)
    if n_rows:
        expected = n_rows + 2 * int(counts_arr.sum())
        joined = " ".join(bodies).replace(":", " ")
        with warnings.catch_warnings():
            # Older numpy warns (DeprecationWarning) instead of raising on
            # unparsable text; make both behave the same.
            warnings.simplefilter("error", DeprecationWarning)
            try:
                flat = np.fromstring(joined, dtype=np.float64, sep=" ")
            except (ValueError, DeprecationWarning):
                flat = None  # type: ignore[assignment]
        # A count mismatch catches tokens numpy splits in two (e.g. "1.5.3").
        if flat is None or flat.size != expected:
            raise _first_bad_number(path, bodies, linenos)
    # Each row is: label, then (index, value) pairs.
    starts = np.cumsum(1 + 2 * counts_arr) - (1 + 2 * counts_arr)
    is_label = np.zeros(flat.size, dtype=bool)
    is_label[starts] = True
    pairs = flat[~is_label].reshape(-1, 2)
    linenos_arr = np.asarray(linenos, dtype=np.int64)
    if pairs.size and pairs[:, 0].max() > _MAX_INDEX:
        k = int(np.argmax(pairs[:, 0] > _MAX_INDEX))
        row = int(np.searchsorted(np.cumsum(counts_arr), k, side="right"))
        raise _line_error(
            path, int(linenos_arr[row]), bodies[row], f"feature index above {_MAX_INDEX}"
        )
    return _Parsed(
        labels=flat[starts],
        counts=counts_arr,
        cols=pairs[:, 0].astype(np.int64),
        vals=pairs[:, 1],
        linenos=linenos_arr,
    )


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _line_text(path: Path, lineno: int) -> str:
    """Re-read one line for an error message (only on the error path)."""
    with _open_binary(path) as raw:
        # Split on b"\n" exactly as _parse does, so line numbers agree.
        for i, line in enumerate(raw, 1):
            if i == lineno:
                return line.decode("utf-8", errors="replace")
    return ""


def read_libsvm(
    path: str | os.PathLike[str],
    n_features: int | None = None,
    zero_based: bool | Literal["auto"] = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """Read an svmlight / LIBSVM file into a dense matrix.

    Format: ``<label> <index>:<value> ...`` per line (see module docstring),
    comments after ``#`` and blank lines ignored, absent features are 0. Plain,
    ``.bz2`` and ``.gz`` files are accepted (compression detected from content).
    Index order within a line does not matter; a repeated index is an error.

    The result is dense: ``n * d * 4`` bytes (e.g. 125 MB for covtype.binary,
    581,012 x 54; 4.4 MB for ijcnn1, 49,990 x 22). Do not use this for very
    high-dimensional sparse sets such as rcv1 or news20.

    Args:
        path: File to read.
        n_features: Number of columns. Default: the largest index found (after
            the one-based shift), so pass it when a split may lack the last
            features and shapes must agree across splits.
        zero_based: Whether indices start at 0. ``"auto"`` (default): zero-based
            if any index is 0, else one-based (the LIBSVM convention).

    Returns:
        ``(X, y)``: float32 array ``(n, d)`` and float32 labels ``(n,)`` as
        written in the file (no remapping).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: a line cannot be parsed (the message gives the file,
            line number and text; this includes a truncated last line such as
            ``1 3:0.5 7:``), an index is negative, 0 in a one-based file,
            repeated in a line or beyond ``n_features``; or the compressed stream
            is corrupt.
    """
    rows, cols, vals, labels, d = read_libsvm_entries(path, n_features, zero_based)
    X = np.zeros((labels.shape[0], d), dtype=np.float32)
    X[rows, cols] = vals
    return X, labels.astype(np.float32)


def read_libsvm_entries(
    path: str | os.PathLike[str],
    n_features: int | None = None,
    zero_based: bool | Literal["auto"] = "auto",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The checked entries of an svmlight / LIBSVM file, for dense or sparse matrices.

    Same arguments, checks and errors as :func:`read_libsvm` (which densifies them;
    ``bilevel.data.newsgroups`` builds a sparse matrix for news20's 62,061 columns).

    Returns:
        ``(rows, cols, values, labels, d)``: int64 row and zero-based column of every entry,
        its float64 value, the float64 label of every row and the number of columns.
    """
    path = Path(path)
    if zero_based not in (True, False, "auto"):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    if n_features is not None and n_features < 0:
        raise ValueError(f"n_features must be >= 0, got {n_features}")
    parsed = _parse(path)
    n = parsed.labels.shape[0]
    rows = np.repeat(np.arange(n, dtype=np.int64), parsed.counts)
    cols = parsed.cols

    def fail_at(entry: int, problem: str) -> DataFormatError:
        lineno = int(parsed.linenos[rows[entry]])
        return _line_error(path, lineno, _line_text(path, lineno), problem)

    if cols.size:
        is_zero_based = bool((cols == 0).any()) if zero_based == "auto" else zero_based
        if not is_zero_based:
            if (cols == 0).any():
                k = int(np.argmax(cols == 0))
                raise fail_at(k, "feature index 0 in a file read as one-based (zero_based=False)")
            cols = cols - 1
        dup = _first_duplicate(rows, cols)
        if dup is not None:
            raise fail_at(dup, f"feature index {int(parsed.cols[dup])} repeated in one line")
    inferred = int(cols.max()) + 1 if cols.size else 0
    d = inferred if n_features is None else n_features
    if inferred > d:
        k = int(np.argmax(cols >= d))
        raise fail_at(
            k,
            f"feature index {int(parsed.cols[k])} exceeds n_features={d}",
        )
    return rows, cols, parsed.vals, parsed.labels, d


def _first_duplicate(rows: np.ndarray, cols: np.ndarray) -> int | None:
    """Return the position of an entry repeating an earlier (row, col), or None."""
    # Files written by LIBSVM tools have increasing indices within a line, which
    # rules out repeats with one O(nnz) pass; only otherwise pay for a sort.
    same_row = rows[1:] == rows[:-1]
    if not (cols[1:][same_row] <= cols[:-1][same_row]).any():
        return None
    order = np.lexsort((cols, rows))
    r, c = rows[order], cols[order]
    dup = (r[1:] == r[:-1]) & (c[1:] == c[:-1])
    if not dup.any():
        return None
    return int(order[int(np.argmax(dup)) + 1])


@dataclass(frozen=True)
class _LibsvmSpec:
    page_name: str  # name on the LIBSVM Data page
    files: dict[str, str]  # split -> file name (without compression suffix)
    n_features: int
    label_map: dict[float, int]  # label in file -> label returned (+1 / -1)
    sizes: str  # documentation only


#: Datasets known to :func:`load_libsvm_dataset`.
LIBSVM_DATASETS: dict[str, _LibsvmSpec] = {
    "ijcnn1": _LibsvmSpec(
        page_name="ijcnn1",
        files={"train": "ijcnn1", "test": "ijcnn1.t"},
        n_features=22,
        label_map={-1.0: -1, 1.0: 1},
        sizes="49,990 train / 91,701 test, 22 features",
    ),
    "covtype": _LibsvmSpec(
        page_name="covtype.binary",
        files={"train": "covtype.libsvm.binary.scale"},
        n_features=54,
        # The binary version labels the two classes 1 and 2.
        label_map={1.0: -1, 2.0: 1},
        sizes="581,012 examples, 54 features (scaled to [0, 1])",
    ),
    "australian": _LibsvmSpec(
        page_name="australian",
        files={"train": "australian_scale"},
        n_features=14,
        label_map={-1.0: -1, 1.0: 1},
        sizes="690 examples, 14 features (scaled to [-1, 1])",
    ),
}

_SUFFIXES = ("", ".bz2", ".gz")


def _candidates(base: str) -> list[str]:
    return [base + suffix for suffix in _SUFFIXES]


def load_libsvm_dataset(
    name: str,
    path: str | os.PathLike[str] | None = None,
    *,
    split: Literal["train", "test"] = "train",
) -> tuple[np.ndarray, np.ndarray]:
    """Load a binary-classification dataset from the LIBSVM Data page.

    Known names, with the file looked for (each also as ``<file>.bz2`` and
    ``<file>.gz``, as distributed on the page):

    * ``"ijcnn1"`` (page entry ``ijcnn1``, IJCNN 2001 challenge): ``ijcnn1``
      (train, 49,990) and ``ijcnn1.t`` (test, 91,701); 22 features; labels -1/+1.
    * ``"covtype"`` (page entry ``covtype.binary``, UCI Covertype):
      ``covtype.libsvm.binary.scale``; 581,012 examples, 54 features; labels 1/2
      in the file, returned as -1/+1.
    * ``"australian"`` (page entry ``australian``, Statlog Australian credit):
      ``australian_scale``; 690 examples, 14 features; labels -1/+1.

    Search: ``path`` if given (and then nothing else), otherwise
    ``$BILEVEL_DATA/libsvm``. The number of columns is fixed per dataset so that
    train and test shapes agree.

    Args:
        name: One of ``"ijcnn1"``, ``"covtype"``, ``"australian"``.
        path: Directory holding the file.
        split: ``"train"``, or ``"test"`` (ijcnn1 only; the others have no
            official test split: use :func:`bilevel.data.train_val_test_split`).

    Returns:
        ``(X, y)``: dense float32 ``(n, d)`` (memory ``n * d * 4`` bytes) and
        int32 labels in {-1, +1}.

    Raises:
        ValueError: unknown ``name`` or ``split``.
        DatasetNotFoundError: no file found; the message lists the file names.
        DataFormatError: malformed file or unexpected label values.
    """
    try:
        spec = LIBSVM_DATASETS[name]
    except KeyError:
        raise ValueError(
            f"unknown LIBSVM dataset {name!r}; known: {', '.join(sorted(LIBSVM_DATASETS))}"
        ) from None
    if split not in spec.files:
        raise ValueError(f"LIBSVM dataset {name!r} has splits {sorted(spec.files)}, not {split!r}")
    names = _candidates(spec.files[split])
    dirs = candidate_dirs(path, "libsvm")
    for directory in dirs:
        found = find_first(directory, names)
        if found is not None:
            break
    else:
        all_files = ", ".join(f"{base} (or {base}.bz2, {base}.gz)" for base in spec.files.values())
        raise DatasetNotFoundError(
            f"LIBSVM dataset {name!r} ({split} split) not found. Searched:\n"
            f"{describe_searched(dirs, 'libsvm', explicit=path is not None)}\n"
            f"Expected file for this split: {names[0]} (or {names[1]}, {names[2]}); all files "
            f"of this dataset: {all_files}. Get them from the LIBSVM Data page "
            f"({LIBSVM_PAGE}, entry {spec.page_name!r}) on a machine with network access and "
            f"put them in a directory passed as path=DIR, or in ROOT/libsvm/ with "
            f"{DATA_ENV_VAR}=ROOT. This library never downloads data."
        )
    X, y = read_libsvm(found, n_features=spec.n_features, zero_based=False)
    values = np.unique(y)
    unexpected = [float(v) for v in values if float(v) not in spec.label_map]
    if unexpected:
        raise DataFormatError(
            f"{found}: unexpected label values {unexpected} for LIBSVM dataset {name!r}; "
            f"expected {sorted(spec.label_map)}"
        )
    mapped = np.empty(y.shape, dtype=np.int32)
    for source, target in spec.label_map.items():
        mapped[y == source] = target
    return X, mapped
