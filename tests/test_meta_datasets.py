"""few_shot_data: miniImageNet when provided (npz, or pickles the user trusts), else the
Fashion-MNIST stand-in, else scikit-learn digits; class splits, normalisation and the note."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from test_data_idx import make_split

from bilevel import data
from bilevel.meta.datasets import MINIIMAGENET_MEAN, MINIIMAGENET_STD, few_shot_data


@pytest.fixture
def digits_only(monkeypatch):
    """No miniImageNet, Fashion-MNIST ignored: the last stand-in."""
    monkeypatch.delenv("BILEVEL_DATA", raising=False)
    monkeypatch.delenv("BILEVEL_TRUST_PICKLE", raising=False)
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")


def write_tiny_miniimagenet(folder, *, as_pickle: bool) -> dict:
    """3 classes x 4 images per split, in learn2learn's pickle layout or the npz layout."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    raw = {}
    for split, l2l in (("train", "train"), ("val", "validation"), ("test", "test")):
        images = rng.integers(0, 256, (12, 84, 84, 3), dtype=np.uint8)
        raw[split] = images
        if as_pickle:
            class_dict = {f"{split}{c}": list(range(c, 12, 3)) for c in range(3)}
            obj = {"image_data": images, "class_dict": class_dict}
            (folder / f"mini-imagenet-cache-{l2l}.pkl").write_bytes(pickle.dumps(obj))
        else:
            names = np.array([f"{split}{c}" for c in range(3)])
            labels = np.arange(12) % 3
            np.savez(
                folder / f"miniimagenet-{split}.npz",
                images=images,
                labels=labels,
                class_names=names,
            )
    return raw


def test_digits_stand_in(digits_only):
    logs = []
    d = few_shot_data(log=logs.append)
    assert d.name == "scikit-learn digits" and d.ways == 4
    assert "miniImageNet not used" in logs[0] and "Fashion-MNIST not found" in logs[1]
    assert list(d.train.class_ids) == list(d.val.class_ids) == list(range(6))
    assert list(d.test.class_ids) == [6, 7, 8, 9]
    for split in (d.train, d.val, d.test):
        assert split.images.shape[1:] == (1, 32, 32) and split.images.dtype == np.float32
    # val is a held-out third of each training digit's images
    counts = np.bincount(data.load_sklearn("digits")[1])
    np.testing.assert_array_equal(d.val.counts(), counts[:6] // 3)
    np.testing.assert_array_equal(d.train.counts() + d.val.counts(), counts[:6])
    np.testing.assert_array_equal(d.test.counts(), counts[6:])
    np.testing.assert_allclose(d.train.images.mean(), 0, atol=1e-5)  # meta-train statistics
    np.testing.assert_allclose(d.train.images.std(), 1, atol=1e-5)
    for words in ("SUBSTITUTE", "digits", "BILEVEL_IGNORE_SYSTEM_DATA=1", "4-way", "0-5", "6-9"):
        assert words in d.note
    assert "convert_miniimagenet_to_npz" in d.note and "not new classes" in d.note


def test_fashion_mnist_stand_in_from_user_files(tmp_path, monkeypatch):
    """The Fashion-MNIST path on any machine: tiny IDX files in $BILEVEL_DATA/fashion-mnist
    (read even with system data ignored), so it runs where the Debian package is missing."""
    (tmp_path / "fashion-mnist").mkdir()
    train_images, train_labels = make_split(tmp_path / "fashion-mnist", "train", 300, 1, gz=False)
    _, test_labels = make_split(tmp_path / "fashion-mnist", "t10k", 120, 2, gz=False)
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")
    monkeypatch.delenv("BILEVEL_TRUST_PICKLE", raising=False)
    d = few_shot_data(log=lambda _: None)
    assert d.name == "Fashion-MNIST" and d.ways == 4
    assert d.train.class_names == data.FASHION_MNIST_CLASSES[:6]
    assert d.test.class_names == data.FASHION_MNIST_CLASSES[6:]
    # meta-train and meta-test from the train file, meta-validation from the t10k file
    train_counts, test_counts = np.bincount(train_labels), np.bincount(test_labels)
    np.testing.assert_array_equal(d.train.counts(), train_counts[:6])
    np.testing.assert_array_equal(d.test.counts(), train_counts[6:])
    np.testing.assert_array_equal(d.val.counts(), test_counts[:6])
    assert d.train.images.shape[1:] == (1, 32, 32)
    # the padding is 2 zero pixels per side, normalised with meta-train statistics
    padded = np.pad(train_images[train_labels < 6] / 255.0, ((0, 0), (2, 2), (2, 2)))
    want = (padded - padded.mean()) / padded.std()
    np.testing.assert_allclose(d.train.images[:, 0], want, atol=1e-5)  # rows keep file order
    assert "SUBSTITUTE: Fashion-MNIST" in d.note and "Shirt, Sneaker, Bag, Ankle boot" in d.note


def test_fashion_mnist_stand_in(monkeypatch):
    """The installed Debian files (skipped where the package is not installed: the same code
    path is covered on any machine by the test above)."""
    monkeypatch.delenv("BILEVEL_DATA", raising=False)
    monkeypatch.delenv("BILEVEL_IGNORE_SYSTEM_DATA", raising=False)
    try:
        data.load_fashion_mnist("test")
    except data.DatasetNotFoundError:
        pytest.skip("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
    d = few_shot_data(log=lambda _: None)
    assert d.name == "Fashion-MNIST" and d.ways == 4
    assert d.train.class_names == data.FASHION_MNIST_CLASSES[:6]
    assert d.test.class_names == data.FASHION_MNIST_CLASSES[6:]
    np.testing.assert_array_equal(d.train.counts(), [6000] * 6)  # from the 60k train file
    np.testing.assert_array_equal(d.test.counts(), [6000] * 4)  # from the same file
    np.testing.assert_array_equal(d.val.counts(), [1000] * 6)  # the 10k test file
    assert d.train.images.shape[1:] == (1, 32, 32)
    border = d.train.images[:, :, :2]  # the zero padding, normalised like every pixel
    np.testing.assert_allclose(border, border.flat[0], rtol=0)
    mean, std = d.train.images.mean(dtype=np.float64), d.train.images.std(dtype=np.float64)
    assert abs(mean) < 1e-5 and abs(std - 1) < 1e-5
    assert "SUBSTITUTE: Fashion-MNIST" in d.note and "Shirt, Sneaker, Bag, Ankle boot" in d.note


def test_miniimagenet_from_npz(tmp_path, digits_only, monkeypatch):
    raw = write_tiny_miniimagenet(tmp_path / "miniimagenet", as_pickle=False)
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path))
    d = few_shot_data(log=pytest.fail)  # nothing passed over
    assert d.name == "miniImageNet" and d.ways == 3  # 5-way capped by the 3 test classes here
    assert list(d.val.class_ids) == [3, 4, 5] and d.test.class_names == ("test0", "test1", "test2")
    assert d.train.images.shape == (12, 3, 84, 84)
    mean, std = np.asarray(MINIIMAGENET_MEAN), np.asarray(MINIIMAGENET_STD)
    want = (raw["test"].transpose(0, 3, 1, 2) / 255.0 - mean[:, None, None]) / std[:, None, None]
    np.testing.assert_allclose(d.test.images, want, rtol=1e-5, atol=1e-5)  # the code's constants
    assert "the paper's dataset" in d.note and "3-way" in d.note


def test_miniimagenet_pickles_need_trust(tmp_path, digits_only, monkeypatch):
    write_tiny_miniimagenet(tmp_path / "miniimagenet", as_pickle=True)
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path))
    logs = []
    assert few_shot_data(log=logs.append).name == "scikit-learn digits"
    assert "trust_pickle=True" in logs[0]
    monkeypatch.setenv("BILEVEL_TRUST_PICKLE", "1")
    assert few_shot_data(log=pytest.fail).name == "miniImageNet"
    assert few_shot_data(log=logs.append, trust_pickle=False).name == "scikit-learn digits"
