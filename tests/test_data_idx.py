"""IDX reader and MNIST / Fashion-MNIST loaders, on files written by the tests."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from bilevel.data import (
    DataFormatError,
    DatasetNotFoundError,
    load_fashion_mnist,
    load_mnist,
    load_mnist_like,
    read_idx,
)
from bilevel.data import idx as idx_module

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")

_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D}
_CODES[np.float64] = 0x0E


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode an array as IDX, written independently of the reader under test."""
    code = _CODES[array.dtype.type]
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write(path: Path, data: bytes, *, gz: bool = False) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def make_split(directory: Path, prefix: str, n: int, seed: int, *, gz: bool):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    suffix = ".gz" if gz else ""
    write(directory / f"{prefix}-images-idx3-ubyte{suffix}", idx_bytes(images), gz=gz)
    write(directory / f"{prefix}-labels-idx1-ubyte{suffix}", idx_bytes(labels), gz=gz)
    return images, labels


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_images_and_labels_roundtrip(tmp_path, gz):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    name = "imgs.idx.gz" if gz else "imgs.idx"
    out = read_idx(write(tmp_path / name, idx_bytes(images), gz=gz))
    assert out.dtype == np.uint8 and out.shape == (5, 28, 28)
    np.testing.assert_array_equal(out, images)
    out = read_idx(write(tmp_path / ("l" + name), idx_bytes(labels), gz=gz))
    np.testing.assert_array_equal(out, labels)
    assert out.flags.writeable


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_read_idx_general_types_big_endian(tmp_path, dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 12).astype(dtype)
    out = read_idx(write(tmp_path / "a.idx", idx_bytes(array)))
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, array)


def test_gzip_detected_from_content_not_suffix(tmp_path):
    labels = np.arange(10, dtype=np.uint8)
    out = read_idx(write(tmp_path / "labels-no-suffix", idx_bytes(labels), gz=True))
    np.testing.assert_array_equal(out, labels)


def test_bad_magic(tmp_path):
    data = b"\x12\x34\x08\x03" + idx_bytes(np.zeros((1, 2, 2), np.uint8))[4:]
    path = write(tmp_path / "bad-magic-idx3-ubyte", data)
    with pytest.raises(DataFormatError) as info:
        read_idx(path)
    message = str(info.value)
    assert "bad-magic-idx3-ubyte" in message
    assert "magic number 0x12340803" in message


def test_unknown_dtype_code(tmp_path):
    data = b"\x00\x00\x0a\x01" + struct.pack(">I", 3) + b"\x00" * 3
    path = write(tmp_path / "wrong-type.idx", data)
    with pytest.raises(DataFormatError) as info:
        read_idx(path)
    message = str(info.value)
    assert "wrong-type.idx" in message
    assert "unknown IDX data type code 0x0A" in message


def test_truncated_file(tmp_path):
    full = idx_bytes(np.ones((5, 28, 28), np.uint8))
    assert len(full) == 16 + 5 * 28 * 28
    path = write(tmp_path / "short-idx3-ubyte", full[:1000])
    with pytest.raises(DataFormatError) as info:
        read_idx(path)
    message = str(info.value)
    assert "short-idx3-ubyte" in message
    assert "truncated" in message
    assert f"expected {len(full)} bytes" in message and "got 1000" in message


def test_truncated_header_and_trailing_bytes(tmp_path):
    full = idx_bytes(np.ones((2, 3), np.uint8))
    with pytest.raises(DataFormatError, match="truncated IDX header"):
        read_idx(write(tmp_path / "h.idx", full[:7]))
    with pytest.raises(DataFormatError, match="trailing bytes"):
        read_idx(write(tmp_path / "t.idx", full + b"\x00"))


def test_truncated_gzip_stream(tmp_path):
    packed = gzip.compress(idx_bytes(np.ones((5, 28, 28), np.uint8)))
    path = write(tmp_path / "cut.gz", packed[: len(packed) // 2])
    with pytest.raises(DataFormatError, match="cut.gz.*gzip"):
        read_idx(path)


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_like_directory(tmp_path, gz):
    train_images, train_labels = make_split(tmp_path, "train", 5, seed=1, gz=gz)
    test_images, test_labels = make_split(tmp_path, "t10k", 3, seed=2, gz=gz)
    X, y = load_mnist_like(tmp_path, "train")
    assert X.dtype == np.float32 and X.shape == (5, 28, 28)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(X, train_images.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(y, train_labels)
    assert 0.0 <= X.min() and X.max() <= 1.0
    X, y = load_mnist_like(tmp_path, "test", kind="fashion-mnist")
    assert X.shape == (3, 28, 28)
    np.testing.assert_array_equal(y, test_labels)


def test_load_mnist_like_label_count_mismatch(tmp_path):
    make_split(tmp_path, "train", 5, seed=1, gz=False)
    write(tmp_path / "train-labels-idx1-ubyte", idx_bytes(np.zeros(4, np.uint8)))
    with pytest.raises(DataFormatError) as info:
        load_mnist_like(tmp_path)
    message = str(info.value)
    assert "train-labels-idx1-ubyte" in message
    assert "label count 4 does not match image count 5" in message


def test_load_mnist_like_rejects_wrong_kind_of_file(tmp_path):
    make_split(tmp_path, "train", 5, seed=1, gz=False)
    # Labels stored where images are expected: valid IDX, wrong magic number.
    write(tmp_path / "train-images-idx3-ubyte", idx_bytes(np.zeros(5, np.uint8)))
    with pytest.raises(DataFormatError, match="0x00000803.*found 0x00000801"):
        load_mnist_like(tmp_path)


def test_load_mnist_like_rejects_bad_split(tmp_path):
    with pytest.raises(ValueError, match="split"):
        load_mnist_like(tmp_path, "validation")  # type: ignore[arg-type]


@pytest.fixture
def no_system_data(monkeypatch, tmp_path):
    """Make the search independent of this machine: no env vars, no Debian files."""
    monkeypatch.delenv("BILEVEL_DATA", raising=False)
    monkeypatch.delenv("BILEVEL_IGNORE_SYSTEM_DATA", raising=False)
    monkeypatch.setattr(idx_module, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "no-such-dir")


@pytest.fixture
def fake_system_dir(monkeypatch, tmp_path):
    """A stand-in for the Debian package's directory holding a 3-image train split."""
    monkeypatch.delenv("BILEVEL_DATA", raising=False)
    monkeypatch.delenv("BILEVEL_IGNORE_SYSTEM_DATA", raising=False)
    system = tmp_path / "usr-share-datasets-fashion-mnist"
    system.mkdir()
    make_split(system, "train", 3, seed=7, gz=True)
    monkeypatch.setattr(idx_module, "FASHION_MNIST_SYSTEM_DIR", system)
    return system


def test_fashion_mnist_missing_says_how_to_install(tmp_path, no_system_data):
    with pytest.raises(DatasetNotFoundError) as info:
        load_fashion_mnist()
    assert "apt-get install dataset-fashion-mnist" in str(info.value)
    assert isinstance(info.value, FileNotFoundError)


def test_fashion_mnist_explicit_path_is_the_only_place_searched(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    # Even where the Debian package is installed, an explicit path is authoritative.
    with pytest.raises(DatasetNotFoundError) as info:
        load_fashion_mnist("test", path=empty)
    message = str(info.value)
    assert "apt-get install dataset-fashion-mnist" in message
    assert str(empty) in message


def test_fashion_mnist_from_env_data_root(tmp_path, monkeypatch, no_system_data):
    root = tmp_path / "root"
    (root / "fashion-mnist").mkdir(parents=True)
    images, labels = make_split(root / "fashion-mnist", "t10k", 4, seed=3, gz=True)
    monkeypatch.setenv("BILEVEL_DATA", str(root))
    X, y = load_fashion_mnist("test")
    assert X.shape == (4, 28, 28)
    np.testing.assert_array_equal(y, labels)


def test_fashion_mnist_from_system_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("BILEVEL_DATA", raising=False)
    monkeypatch.delenv("BILEVEL_IGNORE_SYSTEM_DATA", raising=False)
    system = tmp_path / "usr-share"
    system.mkdir()
    make_split(system, "train", 2, seed=4, gz=True)  # the Debian layout: *.gz files
    monkeypatch.setattr(idx_module, "FASHION_MNIST_SYSTEM_DIR", system)
    X, y = load_fashion_mnist()
    assert X.shape == (2, 28, 28) and y.shape == (2,)


def test_mnist_missing_names_the_files(tmp_path, no_system_data):
    with pytest.raises(DatasetNotFoundError) as info:
        load_mnist("train")
    message = str(info.value)
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
        "BILEVEL_DATA",
        "path=",
    ):
        assert name in message


def test_mnist_partial_directory_is_reported(tmp_path):
    make_split(tmp_path, "train", 2, seed=5, gz=False)
    (tmp_path / "train-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetNotFoundError, match="has train-images-idx3-ubyte but not"):
        load_mnist("train", path=tmp_path)


def test_mnist_from_path(tmp_path):
    images, labels = make_split(tmp_path, "train", 5, seed=6, gz=False)
    X, y = load_mnist("train", path=tmp_path)
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_array_equal(X * 255, images.astype(np.float32))


@pytest.mark.skipif(
    not (DEBIAN_DIR / "train-images-idx3-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist not installed "
    "(apt-get install dataset-fashion-mnist)",
)
def test_debian_fashion_mnist(monkeypatch):
    monkeypatch.delenv("BILEVEL_DATA", raising=False)
    monkeypatch.delenv("BILEVEL_IGNORE_SYSTEM_DATA", raising=False)
    X, y = load_fashion_mnist("train")
    assert X.shape == (60000, 28, 28) and X.dtype == np.float32
    assert y.shape == (60000,)
    np.testing.assert_array_equal(np.unique(y), np.arange(10))


@pytest.mark.parametrize("value", ["1", "true", "YES", " on "])
def test_ignore_system_data_skips_the_system_dir(fake_system_dir, monkeypatch, value):
    assert load_fashion_mnist()[0].shape == (3, 28, 28)  # found while the variable is unset
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", value)
    with pytest.raises(DatasetNotFoundError) as info:
        load_fashion_mnist()
    # the message names the skipped directory and why, so a forgotten variable is visible
    assert f"{fake_system_dir} (skipped: $BILEVEL_IGNORE_SYSTEM_DATA is set)" in str(info.value)


@pytest.mark.parametrize("value", ["0", "false", "", "off"])
def test_ignore_system_data_false_values_keep_the_system_dir(fake_system_dir, monkeypatch, value):
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", value)
    assert load_fashion_mnist()[0].shape == (3, 28, 28)


def test_ignore_system_data_keeps_bilevel_data_and_explicit_paths(
    fake_system_dir, tmp_path, monkeypatch
):
    root = tmp_path / "root"
    (root / "fashion-mnist").mkdir(parents=True)
    (root / "mnist").mkdir()
    _, fashion_labels = make_split(root / "fashion-mnist", "train", 4, seed=8, gz=False)
    _, mnist_labels = make_split(root / "mnist", "t10k", 5, seed=9, gz=True)
    monkeypatch.setenv("BILEVEL_DATA", str(root))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")
    np.testing.assert_array_equal(load_fashion_mnist()[1], fashion_labels)
    np.testing.assert_array_equal(load_mnist("test")[1], mnist_labels)
    # an explicit path is read even when it is the system directory itself
    assert load_fashion_mnist(path=fake_system_dir)[0].shape == (3, 28, 28)


def test_ignore_system_data_rejects_unknown_values(fake_system_dir, monkeypatch):
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "maybe")
    with pytest.raises(ValueError, match=r"BILEVEL_IGNORE_SYSTEM_DATA='maybe' is not understood"):
        load_fashion_mnist()
