"""20 Newsgroups (Lang, 1995) from a local copy in either of its usual vectorized forms.

Two copies a user may have (nothing here downloads; this library never does):

* **scikit-learn's cache** of :func:`sklearn.datasets.fetch_20newsgroups_vectorized`
  (``20news-bydate_py3.pkz``, and ``20newsgroup_vectorized_py3.pkl`` once vectorized, in its
  ``data_home``): the "bydate" split, 11,314 training and 7,532 test documents, a
  ``CountVectorizer`` vocabulary of 130,107 tokens (:func:`bilevel.data.load_20newsgroups`);
* **LIBSVM's "news20"** (LIBSVM Data: Classification (Multi-class),
  https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html): the scaled files
  ``news20.scale`` (15,935 training documents) and ``news20.t.scale`` (3,993 test documents),
  svmlight format, 62,061 features, labels 1..20 (returned as 0..19); each may be
  ``.bz2``/``.gz``-compressed as distributed. Looked for in ``path=DIR``, else
  ``$BILEVEL_DATA/libsvm`` (as the other LIBSVM sets).

:func:`load_newsgroups` takes either (``source="auto"``: the scikit-learn cache first) and
returns the training and test splits with the same columns: optionally only the
``n_features`` columns with the highest training document frequency, rows scaled to unit L2
norm. Matrices stay sparse (``scipy.sparse.csr_matrix``): the dense training matrix would
take gigabytes; densify after reducing ``n_features``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

import numpy as np

from bilevel.data._paths import DATA_ENV_VAR, candidate_dirs, describe_searched, find_first
from bilevel.data.columns import frequent_columns
from bilevel.data.errors import DataFormatError, DatasetNotFoundError
from bilevel.data.libsvm import read_libsvm_entries

__all__ = [
    "NEWS20_LIBSVM_FILES",
    "NEWS20_FEATURES",
    "Newsgroups",
    "frequent_columns",
    "load_news20_libsvm",
    "load_newsgroups",
]

NEWS20_PAGE = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html"
NEWS20_URL = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/"
#: split -> LIBSVM file name (scaled versions; each also looked for as .bz2 and .gz)
NEWS20_LIBSVM_FILES = {"train": "news20.scale", "test": "news20.t.scale"}
#: columns of LIBSVM's news20 (fixed, so that both splits have the same shape)
NEWS20_FEATURES = 62061
NUM_CLASSES = 20
#: scikit-learn's cache of the raw documents (written by ``fetch_20newsgroups``)
SKLEARN_CACHE_FILE = "20news-bydate_py3.pkz"

_SUFFIXES = ("", ".bz2", ".gz")


@dataclasses.dataclass(frozen=True)
class Newsgroups:
    """The training and test splits of 20 Newsgroups and where they came from.

    ``X_*`` are ``scipy.sparse.csr_matrix`` of float32 with the same columns, ``y_*`` int32
    labels in 0..19. ``source`` is ``"scikit-learn cache"`` or ``"LIBSVM news20"``;
    ``description`` a sentence for experiment outputs (source, location, sizes).
    """

    X_train: object
    y_train: np.ndarray
    X_test: object
    y_test: np.ndarray
    source: str
    description: str


def load_news20_libsvm(
    path: str | os.PathLike[str] | None = None,
    *,
    split: Literal["train", "test"] = "train",
):
    """LIBSVM's scaled news20 split as a sparse matrix (see the module docstring).

    Args:
        path: directory holding ``news20.scale`` / ``news20.t.scale`` (or ``.bz2``, ``.gz``);
            default ``$BILEVEL_DATA/libsvm``.
        split: ``"train"`` (news20.scale) or ``"test"`` (news20.t.scale).

    Returns:
        ``(X, y)``: ``scipy.sparse.csr_matrix`` float32 ``(n, 62061)`` as in the file, and int32
        labels 0..19 (the file's 1..20 minus one).

    Raises:
        DatasetNotFoundError: the file is absent; the message lists where it was looked for
            and how to get it.
        DataFormatError: the file is not svmlight text (the file and line are named), or its
            labels are not integers 1..20.
    """
    import scipy.sparse as sp

    if split not in NEWS20_LIBSVM_FILES:
        raise ValueError(f"news20 has splits 'train' and 'test', not {split!r}.")
    base = NEWS20_LIBSVM_FILES[split]
    names = [base + suffix for suffix in _SUFFIXES]
    dirs = candidate_dirs(path, "libsvm")
    found = next((f for f in (find_first(d, names) for d in dirs) if f is not None), None)
    if found is None:
        raise DatasetNotFoundError(
            f"LIBSVM news20 ({split} split) not found. Searched:\n"
            f"{describe_searched(dirs, 'libsvm', explicit=path is not None)}\n"
            f"Expected {names[0]} (or {names[1]}, {names[2]}). On a machine with network "
            f"access run: wget {NEWS20_URL}{base}.bz2 (from {NEWS20_PAGE}, entry 'news20', "
            f"scaled version), then put it in a directory passed as path=DIR, or in "
            f"ROOT/libsvm/ with {DATA_ENV_VAR}=ROOT. This library never downloads data."
        )
    rows, cols, vals, labels, d = read_libsvm_entries(found, NEWS20_FEATURES, zero_based=False)
    bad = labels[(labels != np.round(labels)) | (labels < 1) | (labels > NUM_CLASSES)]
    if bad.size:
        raise DataFormatError(
            f"{found}: label {float(bad[0])!r} is not a news20 class; LIBSVM's news20 labels "
            f"its {NUM_CLASSES} classes 1..{NUM_CLASSES}. Is this the multiclass news20 file?"
        )
    X = sp.csr_matrix((vals.astype(np.float32), (rows, cols)), shape=(labels.shape[0], d))
    return X, labels.astype(np.int32) - 1


def _from_sklearn(path, n_features, normalize) -> Newsgroups:
    from sklearn import datasets

    from bilevel.data.sklearn_sets import load_20newsgroups

    where = Path(path).expanduser() if path is not None else Path(datasets.get_data_home())
    try:
        X_train, y_train = load_20newsgroups(path, n_features, subset="train", normalize=normalize)
        X_test, y_test = load_20newsgroups(path, n_features, subset="test", normalize=normalize)
    except DatasetNotFoundError as err:
        cache = where / SKLEARN_CACHE_FILE
        if cache.is_file():  # there, but scikit-learn could not read it (it prints why)
            raise DataFormatError(
                f"{cache}: scikit-learn could not read this 20 Newsgroups cache (corrupt, "
                "truncated or not a scikit-learn cache file). Delete it and copy a fresh one "
                "from a machine with network access (sklearn.datasets."
                "fetch_20newsgroups_vectorized(data_home=DIR) writes it to DIR)."
            ) from err
        raise
    return Newsgroups(
        X_train,
        y_train,
        X_test,
        y_test,
        "scikit-learn cache",
        f"20 Newsgroups from scikit-learn's cache at {where} ({X_train.shape[0]} training / "
        f"{X_test.shape[0]} test documents, {X_train.shape[1]} word-count columns"
        f"{', rows scaled to unit norm' if normalize else ''})",
    )


def _from_libsvm(path, n_features, normalize) -> Newsgroups:
    from sklearn import preprocessing

    X_train, y_train = load_news20_libsvm(path, split="train")
    X_test, y_test = load_news20_libsvm(path, split="test")
    if n_features is not None and n_features < X_train.shape[1]:
        keep = frequent_columns(X_train, n_features)
        X_train, X_test = X_train[:, keep], X_test[:, keep]
    if normalize:
        X_train = preprocessing.normalize(X_train, norm="l2", copy=False)
        X_test = preprocessing.normalize(X_test, norm="l2", copy=False)
    return Newsgroups(
        X_train.tocsr(),
        y_train,
        X_test.tocsr(),
        y_test,
        "LIBSVM news20",
        f"20 Newsgroups as LIBSVM's news20 (scaled; {X_train.shape[0]} training / "
        f"{X_test.shape[0]} test documents, {X_train.shape[1]} columns"
        f"{', rows scaled to unit norm' if normalize else ''})",
    )


def load_newsgroups(
    path: str | os.PathLike[str] | None = None,
    *,
    source: Literal["auto", "sklearn", "libsvm"] = "auto",
    n_features: int | None = None,
    normalize: bool = True,
) -> Newsgroups:
    """20 Newsgroups' training and test splits from whichever local copy there is.

    Args:
        path: where the copy is: scikit-learn's ``data_home`` (holding
            ``20news-bydate_py3.pkz``) or the directory of LIBSVM's ``news20.scale`` and
            ``news20.t.scale``. Default: scikit-learn's default cache (``$SCIKIT_LEARN_DATA`` or
            ``~/scikit_learn_data``; skipped with ``$BILEVEL_IGNORE_SYSTEM_DATA=1``) and
            ``$BILEVEL_DATA/libsvm``.
        source: ``"sklearn"``, ``"libsvm"``, or ``"auto"`` (scikit-learn's cache, else LIBSVM's
            files).
        n_features: keep only the columns with the highest training document frequency
            (:func:`frequent_columns`), the same in both splits. Default: all.
        normalize: scale every row to unit L2 norm (after the column selection).

    Returns:
        A :class:`Newsgroups`.

    Raises:
        DatasetNotFoundError: no copy found; the message says, for each form, where it was
            looked for and how to get it on a machine with network access.
        DataFormatError: a copy exists but cannot be read (a wrong or corrupt file, named).
        ValueError: bad ``source`` or ``n_features``.
    """
    if source not in ("auto", "sklearn", "libsvm"):
        raise ValueError(
            f"load_newsgroups(source={source!r}) must be 'auto', 'sklearn' or 'libsvm'."
        )
    if n_features is not None and (isinstance(n_features, bool) or n_features < 1):
        raise ValueError(f"load_newsgroups(n_features={n_features!r}) must be a positive int.")
    if source == "sklearn":
        return _from_sklearn(path, n_features, normalize)
    if source == "libsvm":
        return _from_libsvm(path, n_features, normalize)
    try:
        return _from_sklearn(path, n_features, normalize)
    except DatasetNotFoundError as sk_err:
        try:
            return _from_libsvm(path, n_features, normalize)
        except DatasetNotFoundError as lib_err:
            raise DatasetNotFoundError(
                "20 Newsgroups not found in either of its forms.\n"
                f"(a) scikit-learn's cache: {sk_err}\n(b) LIBSVM's news20: {lib_err}"
            ) from lib_err
