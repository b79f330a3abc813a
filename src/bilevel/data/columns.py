"""Column selection shared by the text loaders (20 Newsgroups in LIBSVM form and scikit-learn's
copy): the most frequent vocabulary columns of a sparse document-term matrix."""

from __future__ import annotations

import numpy as np

__all__ = ["frequent_columns"]


def frequent_columns(X_train, n_features: int) -> np.ndarray:
    """The (sorted) indices of the ``n_features`` columns of a sparse ``X_train`` with the
    highest document frequency (rows with a non-zero entry); ties keep column order, so the
    choice is deterministic."""
    train = X_train.tocsr(copy=True)
    train.eliminate_zeros()
    doc_freq = np.bincount(train.indices, minlength=train.shape[1])
    return np.sort(np.argsort(-doc_freq, kind="stable")[:n_features])
