"""Datasets bundled with scikit-learn and the cache-only 20 Newsgroups loader."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.datasets
from sklearn.utils import Bunch

from bilevel.data import DatasetNotFoundError, load_20newsgroups, load_sklearn


@pytest.mark.parametrize(
    ("name", "shape", "num_classes"),
    [("breast_cancer", (569, 30), 2), ("digits", (1797, 64), 10), ("iris", (150, 4), 3)],
)
def test_load_sklearn_bundled(name, shape, num_classes):
    X, y = load_sklearn(name)
    assert X.shape == shape and X.dtype == np.float32
    assert y.shape == (shape[0],) and y.dtype == np.int32
    np.testing.assert_array_equal(np.unique(y), np.arange(num_classes))


def test_load_sklearn_wine_and_unknown():
    X, _ = load_sklearn("wine")
    assert X.shape == (178, 13)
    with pytest.raises(ValueError, match="breast_cancer"):
        load_sklearn("mnist")


@pytest.fixture
def no_network(monkeypatch):
    """Fail loudly if anything tries to open a connection."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_20newsgroups_missing_cache(tmp_path, no_network):
    empty = tmp_path / "sklearn_home"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError) as info:
        load_20newsgroups(path=empty)
    message = str(info.value)
    assert str(empty) in message
    assert "~/scikit_learn_data" in message and "SCIKIT_LEARN_DATA" in message
    assert "cannot be downloaded" in message


def fake_fetch(calls):
    # 3 train docs x 5 terms, 2 test docs; term document frequencies in train:
    # col0: 3, col1: 1, col2: 2, col3: 0, col4: 2.
    train = sp.csr_matrix(
        np.array([[1, 0, 2, 0, 0], [3, 1, 0, 0, 1], [1, 0, 1, 0, 4]], dtype=np.int64)
    )
    test = sp.csr_matrix(np.array([[0, 0, 0, 5, 1], [2, 2, 0, 0, 0]], dtype=np.int64))

    def fetch(*, subset, data_home, download_if_missing, normalize):
        assert download_if_missing is False
        calls.append(subset)
        X, y = (train, [0, 1, 2]) if subset == "train" else (test, [3, 4])
        return Bunch(data=X.copy(), target=np.array(y))

    return fetch


def test_20newsgroups_from_cache_with_feature_selection(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(sklearn.datasets, "fetch_20newsgroups_vectorized", fake_fetch(calls))
    X, y = load_20newsgroups(path=tmp_path, normalize=False)
    assert sp.issparse(X) and X.dtype == np.float32 and X.shape == (3, 5)
    np.testing.assert_array_equal(y, [0, 1, 2])
    assert y.dtype == np.int32
    # Top-3 train document frequency: columns 0, 2, 4 (tie 2/4 kept in column order).
    X, _ = load_20newsgroups(path=tmp_path, n_features=3, subset="test")
    assert calls[-2:] == ["test", "train"]
    dense = X.toarray()
    expected = np.array([[0, 0, 1], [2, 0, 0]], dtype=np.float64)
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(dense, expected, rtol=1e-6)


def test_20newsgroups_default_cache_ignored_with_ignore_system_data(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(sklearn.datasets, "fetch_20newsgroups_vectorized", fake_fetch(calls))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")
    with pytest.raises(DatasetNotFoundError, match=r"\$BILEVEL_IGNORE_SYSTEM_DATA is set"):
        load_20newsgroups()
    assert calls == []  # scikit-learn's cache was not even asked
    X, _ = load_20newsgroups(path=tmp_path, normalize=False)  # an explicit path still works
    assert X.shape == (3, 5) and calls == ["train"]
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "0")
    assert load_20newsgroups(normalize=False)[0].shape == (3, 5)  # the default cache again
