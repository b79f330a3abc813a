"""miniImageNet loader on tiny files the tests write: both pickle layouts, the refusal to unpickle
without trust, the one-time npz conversion, the search order and malformed files."""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from bilevel.data import (
    DataFormatError,
    DatasetNotFoundError,
    UntrustedPickleError,
    convert_miniimagenet_to_npz,
    load_miniimagenet,
)

L2L = {"train": "train", "val": "validation", "test": "test"}
MON = {"train": "train_phase_train", "val": "val", "test": "test"}


def tiny_images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 3), dtype=np.uint8)


def write_l2l(directory: Path, split: str, images, class_dict) -> Path:
    """learn2learn's layout: {"image_data": uint8 (n, 84, 84, 3), "class_dict": {name: rows}}."""
    path = directory / f"mini-imagenet-cache-{L2L[split]}.pkl"
    path.write_bytes(pickle.dumps({"image_data": images, "class_dict": class_dict}))
    return path


def l2l_split(directory: Path, split: str, seed: int):
    """3 classes x 4 images, rows interleaved, names out of sorted order in the dict."""
    images = tiny_images(12, seed)
    class_dict = {
        f"n0{seed}c": [2, 5, 8, 11],
        f"n0{seed}a": [0, 3, 6, 9],
        f"n0{seed}b": [1, 4, 7, 10],
    }
    write_l2l(directory, split, images, class_dict)
    return images


class Py2Pickler(pickle._Pickler):
    """Writes str and bytes as Python 2 ``str`` (BINSTRING), as MetaOptNet's files were pickled
    under Python 2: numpy's raw array bytes then need ``encoding="latin1"`` to load."""

    dispatch = pickle._Pickler.dispatch.copy()

    def save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(raw)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def write_metaoptnet(directory: Path, split: str, obj: dict) -> Path:
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    path = directory / f"miniImageNet_category_split_{MON[split]}.pickle"
    path.write_bytes(buf.getvalue())
    return path


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("BILEVEL_DATA", raising=False)


def test_learn2learn_pickle_layout(tmp_path):
    images = l2l_split(tmp_path, "val", seed=1)
    got = load_miniimagenet("val", tmp_path, trust_pickle=True)
    assert got.class_names == ("n01a", "n01b", "n01c")  # sorted names -> labels 0, 1, 2
    np.testing.assert_array_equal(got.labels, np.arange(12) % 3)
    assert got.labels.dtype == np.int32
    np.testing.assert_array_equal(got.images, images)


def test_metaoptnet_python2_pickle_layout(tmp_path):
    images = tiny_images(6, seed=2)
    labels = [71, 64, 71, 64, 70, 70]  # global class ids, as MetaOptNet's files hold them
    names = {"n02": 64, "n03": 70, "n01": 71}
    obj = {"data": images, "labels": labels, "catname2label": names}
    path = write_metaoptnet(tmp_path, "test", obj)
    with pytest.raises(UnicodeDecodeError):  # a genuine Python 2 pickle: needs latin1
        pickle.loads(path.read_bytes())
    got = load_miniimagenet("test", tmp_path, trust_pickle=True)
    assert got.class_names == ("n02", "n03", "n01")  # classes in id order 64, 70, 71
    np.testing.assert_array_equal(got.labels, [2, 0, 2, 0, 1, 1])
    np.testing.assert_array_equal(got.images, images)


def test_pickle_refused_without_trust_and_not_run(tmp_path):
    witness = tmp_path / "code-ran"
    # a pickle that runs code when loaded: Path.touch(witness)
    path = tmp_path / "mini-imagenet-cache-train.pkl"
    path.write_bytes(pickle.dumps(_Touch(witness)))
    with pytest.raises(UntrustedPickleError, match="trust_pickle=True") as err:
        load_miniimagenet("train", tmp_path)
    assert "convert_miniimagenet_to_npz" in str(err.value) and str(path) in str(err.value)
    assert not witness.exists()
    with pytest.raises(DataFormatError, match="expected a pickled dict"):
        load_miniimagenet("train", tmp_path, trust_pickle=True)
    assert witness.exists()  # what trust_pickle=True allows: the file's code ran


class _Touch:
    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_convert_to_npz_round_trip_reads_without_pickle(tmp_path):
    src, dst = tmp_path / "pkl", tmp_path / "npz"
    src.mkdir()
    for seed, split in enumerate(("train", "val", "test")):
        l2l_split(src, split, seed)
    with pytest.raises(UntrustedPickleError):
        convert_miniimagenet_to_npz(src, dst, trust_pickle=False)
    assert not list(dst.glob("*.npz"))
    written = convert_miniimagenet_to_npz(src, dst, trust_pickle=True)
    assert [p.name for p in written] == [f"miniimagenet-{s}.npz" for s in ("train", "val", "test")]
    assert sorted(p.name for p in dst.iterdir()) == sorted(p.name for p in written)  # no .partial
    for split in ("train", "val", "test"):
        want = load_miniimagenet(split, src, trust_pickle=True)
        got = load_miniimagenet(split, dst)  # npz: no flag needed
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)
        with np.load(dst / f"miniimagenet-{split}.npz", allow_pickle=False) as z:
            assert all(z[k].dtype != object for k in z.files)


def write_npz(directory: Path, split: str, images, labels, names) -> Path:
    path = directory / f"miniimagenet-{split}.npz"
    np.savez(path, images=images, labels=labels, class_names=np.array(names))
    return path


def test_npz_preferred_and_data_root_searched(tmp_path, monkeypatch):
    folder = tmp_path / "miniimagenet"
    folder.mkdir()
    images, labels = tiny_images(4, seed=3), np.array([1, 0, 1, 0], np.int32)
    write_npz(folder, "test", images, labels, ["x", "y"])
    write_l2l(folder, "test", images[:0], {})  # a broken pickle beside it is never opened
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path))
    got = load_miniimagenet("test")
    assert got.class_names == ("x", "y")
    np.testing.assert_array_equal(got.images, images)
    np.testing.assert_array_equal(got.labels, labels)


def test_missing_lists_where_it_looked(tmp_path, no_env):
    with pytest.raises(DatasetNotFoundError) as err:
        load_miniimagenet("val", tmp_path)
    msg = str(err.value)
    assert str(tmp_path) in msg and "mini-imagenet-cache-validation.pkl" in msg
    assert "miniimagenet-val.npz" in msg and "never downloads" in msg
    with pytest.raises(DatasetNotFoundError, match=r"\$BILEVEL_DATA is not set"):
        load_miniimagenet("val")
    with pytest.raises(ValueError, match="split must be one of"):
        load_miniimagenet("validation", tmp_path)


BAD_L2L = {  # message -> (image_data, class_dict)
    r"must be an array \(n, 84, 84, 3\)": (np.zeros((4, 32, 32, 3), np.uint8), {"a": [0]}),
    "must be uint8": (np.zeros((4, 84, 84, 3), np.float32), {"a": [0, 1, 2, 3]}),
    r"no images for classes \['b'\]": (tiny_images(2, 0), {"a": [0, 1], "b": []}),
    "rows outside": (tiny_images(2, 0), {"a": [0, 5]}),
    "shares rows": (tiny_images(2, 0), {"a": [0, 1], "b": [1]}),
    "belong to no class": (tiny_images(3, 0), {"a": [0, 1]}),
}


@pytest.mark.parametrize("match", list(BAD_L2L))
def test_bad_learn2learn_files(tmp_path, match):
    write_l2l(tmp_path, "train", *BAD_L2L[match])
    with pytest.raises(DataFormatError, match=match):
        load_miniimagenet("train", tmp_path, trust_pickle=True)


def test_bad_pickles_and_npz(tmp_path):
    path = tmp_path / "mini-imagenet-cache-train.pkl"
    path.write_bytes(b"\x80\x04garbage")
    with pytest.raises(DataFormatError, match="not a readable pickle"):
        load_miniimagenet("train", tmp_path, trust_pickle=True)
    path.write_bytes(pickle.dumps({"images": 1}))
    with pytest.raises(DataFormatError, match=r"missing keys \['image_data', 'class_dict'\]"):
        load_miniimagenet("train", tmp_path, trust_pickle=True)
    write_metaoptnet(tmp_path, "val", {"data": tiny_images(2, 0), "labels": [0, 1, 1]})
    with pytest.raises(DataFormatError, match="expected 2 integer labels"):
        load_miniimagenet("val", tmp_path, trust_pickle=True)
    # an npz holding an object array would need pickle to read: refused as malformed
    write_npz(tmp_path, "test", np.array([None]), [0], ["a"])
    with pytest.raises(DataFormatError, match="not an npz file of plain arrays"):
        load_miniimagenet("test", tmp_path)
