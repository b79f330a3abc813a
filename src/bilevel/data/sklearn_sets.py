"""Small datasets bundled with scikit-learn, and 20 Newsgroups from its cache.

``load_sklearn`` uses the copies shipped inside the scikit-learn wheel, so it
never touches the network. ``load_20newsgroups`` only reads scikit-learn's
on-disk cache (``download_if_missing=False``): 20 Newsgroups is not bundled and
cannot be downloaded on machines without network access; with
``$BILEVEL_IGNORE_SYSTEM_DATA=1`` that cache counts as absent unless passed as ``path=``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np

from bilevel.data._paths import IGNORE_SYSTEM_ENV_VAR, system_data_ignored
from bilevel.data.errors import DatasetNotFoundError

__all__ = ["SKLEARN_DATASETS", "load_20newsgroups", "load_sklearn"]

#: name -> (scikit-learn loader function name, description for docs/messages).
SKLEARN_DATASETS: dict[str, tuple[str, str]] = {
    "breast_cancer": (
        "load_breast_cancer",
        "Wisconsin diagnostic breast cancer (UCI WDBC): 569 x 30, 2 classes",
    ),
    "digits": (
        "load_digits",
        "UCI optical recognition of handwritten digits, 8x8 images: 1797 x 64 with integer "
        "pixel values 0..16, 10 classes",
    ),
    "iris": ("load_iris", "Fisher's iris (1936): 150 x 4, 3 classes"),
    "wine": ("load_wine", "UCI wine recognition: 178 x 13, 3 classes"),
}


def load_sklearn(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Load a dataset bundled with scikit-learn (no download, no cache).

    Available names (see :data:`SKLEARN_DATASETS`): ``"breast_cancer"``
    (569 x 30, 2 classes), ``"digits"`` (1797 x 64, 10 classes, raw pixel values
    0..16, not rescaled), ``"iris"`` (150 x 4, 3 classes), ``"wine"`` (178 x 13,
    3 classes). Features are returned unscaled; use
    :func:`bilevel.data.standardize` after splitting.

    Args:
        name: Dataset name.

    Returns:
        ``(X, y)``: float32 ``(n, d)`` and int32 labels ``(n,)`` in
        ``0..num_classes-1``.

    Raises:
        ValueError: unknown ``name``.
    """
    if name not in SKLEARN_DATASETS:
        raise ValueError(
            f"unknown scikit-learn dataset {name!r}; known: {', '.join(sorted(SKLEARN_DATASETS))}"
        )
    # Imported lazily: sklearn.datasets takes a noticeable time to import and
    # most users of bilevel.data never need it.
    from sklearn import datasets

    loader = getattr(datasets, SKLEARN_DATASETS[name][0])
    X, y = loader(return_X_y=True)
    return np.asarray(X, dtype=np.float32), np.asarray(y, dtype=np.int32)


def load_20newsgroups(
    path: str | os.PathLike[str] | None = None,
    n_features: int | None = None,
    *,
    subset: Literal["train", "test", "all"] = "train",
    normalize: bool = True,
):
    """Load 20 Newsgroups (Lang, 1995; "bydate" version) as bag-of-words counts.

    Uses :func:`sklearn.datasets.fetch_20newsgroups_vectorized` with
    ``download_if_missing=False``, so it works only when scikit-learn's cache
    already holds the data (``20news-bydate_py3.pkz`` and/or
    ``20newsgroup_vectorized_py3.pkl`` under ``data_home``). The vectorization is
    scikit-learn's: a ``CountVectorizer`` vocabulary of 130,107 tokens; 11,314
    training and 7,532 test documents in 20 classes.

    Args:
        path: scikit-learn ``data_home``. Default: scikit-learn's own default,
            ``$SCIKIT_LEARN_DATA`` or else ``~/scikit_learn_data``; that cache is
            data this machine happened to download, so it is treated as absent when
            ``$BILEVEL_IGNORE_SYSTEM_DATA`` is ``1`` (an explicit ``path`` is still read).
        n_features: Keep only this many columns: those with the highest
            document frequency in the *training* subset (ties broken by column
            order), so train and test keep the same columns. Default: all.
        subset: ``"train"``, ``"test"`` or ``"all"``.
        normalize: Scale each document (row) to unit L2 norm, after the column
            selection (so rows stay unit-norm when ``n_features`` is set).

    Returns:
        ``(X, y)``: ``X`` a ``scipy.sparse.csr_matrix`` of float32 and shape
        ``(n_docs, n_features or 130107)`` -- sparse, because the dense training
        matrix would take 5.9 GB; call ``X.toarray()`` only after reducing
        ``n_features``. ``y`` int32 ``(n_docs,)`` in 0..19.

    Raises:
        DatasetNotFoundError: the data is not in the cache (or the default cache
            is ignored, see ``path``); the message says where scikit-learn looked
            and how to populate it elsewhere.
        ValueError: invalid ``n_features``.
    """
    if n_features is not None and n_features <= 0:
        raise ValueError(f"n_features must be positive, got {n_features}")
    if path is None and system_data_ignored():
        raise DatasetNotFoundError(
            f"20 Newsgroups: scikit-learn's default cache ($SCIKIT_LEARN_DATA or "
            f"~/scikit_learn_data) was not searched because ${IGNORE_SYSTEM_ENV_VAR} is set. "
            "Pass path=DIR holding 20news-bydate_py3.pkz / 20newsgroup_vectorized_py3.pkl, "
            f"or unset ${IGNORE_SYSTEM_ENV_VAR}."
        )
    from sklearn import datasets, preprocessing

    data_home = None if path is None else str(Path(path).expanduser())

    def fetch(which: str):
        try:
            return datasets.fetch_20newsgroups_vectorized(
                subset=which,
                data_home=data_home,
                download_if_missing=False,  # never reach for the network
                normalize=False,  # counts; normalization is done below, after selection
            )
        except OSError as exc:
            where = data_home if data_home is not None else datasets.get_data_home()
            raise DatasetNotFoundError(
                f"20 Newsgroups is not in scikit-learn's cache at {where} "
                "(scikit-learn's data_home: path= here, else $SCIKIT_LEARN_DATA, else "
                "~/scikit_learn_data). It cannot be downloaded on this machine, and this "
                "library never downloads data. On a machine with network access run "
                "sklearn.datasets.fetch_20newsgroups_vectorized(data_home=DIR), copy DIR "
                "(with 20news-bydate_py3.pkz and 20newsgroup_vectorized_py3.pkl) here and "
                "pass path=DIR."
            ) from exc

    bunch = fetch(subset)
    X = bunch.data.tocsr()
    y = np.asarray(bunch.target, dtype=np.int32)
    if n_features is not None and n_features < X.shape[1]:
        from bilevel.data.columns import frequent_columns

        train = X if subset == "train" else fetch("train").data.tocsr()
        X = X[:, frequent_columns(train, n_features)]
    X = X.astype(np.float32).tocsr()
    if normalize:
        X = preprocessing.normalize(X, norm="l2", copy=False)
    return X, y
