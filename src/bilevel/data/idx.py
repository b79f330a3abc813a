"""IDX reader and MNIST / Fashion-MNIST loaders.

The IDX format is described on LeCun, Cortes & Burges, "The MNIST database of
handwritten digits" (http://yann.lecun.com/exdb/mnist/, section "FILE FORMATS FOR
THE MNIST DATABASE"). A file is::

    magic number   4 bytes: 0x00 0x00 <type code> <number of dimensions>
    sizes          <number of dimensions> big-endian unsigned 32-bit integers
    data           prod(sizes) values of the given type, big-endian, row-major

with type codes 0x08 unsigned byte, 0x09 signed byte, 0x0B short (2 bytes),
0x0C int (4 bytes), 0x0D float (4 bytes), 0x0E double (8 bytes). MNIST images are
``0x00000803`` (unsigned bytes, 3 dimensions: n x 28 x 28) and labels
``0x00000801`` (unsigned bytes, 1 dimension: n).

Fashion-MNIST (Xiao, Rasul & Vollgraf, "Fashion-MNIST: a Novel Image Dataset for
Benchmarking Machine Learning Algorithms", arXiv:1708.07747, 2017) uses the same
format and file names. Debian ships it as the package ``dataset-fashion-mnist``,
which installs the four gzipped files
``/usr/share/datasets/fashion-mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``.

Nothing here downloads data: loaders search local directories and raise
:class:`~bilevel.data.errors.DatasetNotFoundError` (saying how to get the files)
when they are absent.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from pathlib import Path
from typing import Literal

import numpy as np

from bilevel.data._paths import DATA_ENV_VAR, candidate_dirs, describe_searched, find_first
from bilevel.data.errors import DataFormatError, DatasetNotFoundError

__all__ = [
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_SYSTEM_DIR",
    "load_fashion_mnist",
    "load_mnist",
    "load_mnist_like",
    "read_idx",
]

#: Where the Debian package ``dataset-fashion-mnist`` installs its files
#: (checked against the package's file list, version 0.0~git20200523.55506a9-1).
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")

#: Class names of Fashion-MNIST labels 0..9 (from the dataset's README).
FASHION_MNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

# type code -> (name used in messages, big-endian numpy dtype)
_IDX_TYPES: dict[int, tuple[str, str]] = {
    0x08: ("unsigned byte", ">u1"),
    0x09: ("signed byte", ">i1"),
    0x0B: ("short", ">i2"),
    0x0C: ("int", ">i4"),
    0x0D: ("float", ">f4"),
    0x0E: ("double", ">f8"),
}
_VALID_CODES = ", ".join(f"0x{c:02X} ({name})" for c, (name, _) in _IDX_TYPES.items())

_GZIP_MAGIC = b"\x1f\x8b"

_IMAGES_MAGIC = 0x00000803
_LABELS_MAGIC = 0x00000801
_NUM_CLASSES = 10

Split = Literal["train", "test"]
Kind = Literal["mnist", "fashion-mnist"]

# split -> file-name prefix used by both MNIST and Fashion-MNIST
_PREFIX = {"train": "train", "test": "t10k"}
_ALL_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _read_maybe_gzip(path: Path) -> tuple[bytes, bool]:
    """Return the file's bytes, gunzipped when the content is gzip.

    Compression is detected from the content, not the suffix: an IDX file always
    starts with two zero bytes, so it cannot be confused with the gzip signature,
    and sniffing tolerates files that were renamed or decompressed in place.
    """
    raw = path.read_bytes()
    if raw[:2] != _GZIP_MAGIC:
        return raw, False
    try:
        return gzip.decompress(raw), True
    except (EOFError, OSError, zlib.error) as exc:
        raise DataFormatError(f"{path}: corrupt or truncated gzip stream ({exc})") from exc


def _read_idx(path: Path) -> tuple[np.ndarray, int]:
    """Read an IDX file and also return its magic number (for callers' checks)."""
    data, compressed = _read_maybe_gzip(path)
    # Byte counts in messages refer to the decompressed stream; say so.
    note = " after gzip decompression" if compressed else ""
    size = len(data)
    if size < 4:
        raise DataFormatError(
            f"{path}: truncated IDX file: expected at least 4 bytes (magic number), "
            f"got {size}{note}"
        )
    magic = int.from_bytes(data[:4], "big")
    if data[0] != 0 or data[1] != 0:
        raise DataFormatError(
            f"{path}: bad IDX magic number 0x{magic:08X}: its first two bytes must be zero "
            f"(e.g. 0x{_IMAGES_MAGIC:08X} for images, 0x{_LABELS_MAGIC:08X} for labels); "
            "this is not an IDX file"
        )
    code, ndim = data[2], data[3]
    if code not in _IDX_TYPES:
        raise DataFormatError(
            f"{path}: unknown IDX data type code 0x{code:02X} in magic number 0x{magic:08X}; "
            f"valid codes are {_VALID_CODES}"
        )
    if ndim == 0:
        raise DataFormatError(f"{path}: IDX magic number 0x{magic:08X} declares 0 dimensions")
    header = 4 + 4 * ndim
    if size < header:
        raise DataFormatError(
            f"{path}: truncated IDX header: expected {header} bytes (magic number and "
            f"{ndim} dimension sizes), got {size}{note}"
        )
    dims = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[code][1])
    count = math.prod(dims)
    expected = header + count * dtype.itemsize
    if size != expected:
        problem = "truncated IDX file" if size < expected else "IDX file has trailing bytes"
        shape = "x".join(map(str, dims))
        raise DataFormatError(
            f"{path}: {problem}: expected {expected} bytes ({header}-byte header + "
            f"{shape} values of {dtype.itemsize} byte(s)), got {size}{note}"
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)
    # astype copies: the result is writable, native-endian and does not keep the
    # (possibly large) decompressed buffer alive.
    return array.astype(dtype.newbyteorder("=")), magic


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (plain or gzip-compressed) into a numpy array.

    Format as described on LeCun's MNIST page (see module docstring): a magic
    number ``0x0000TTDD`` with type code ``TT`` and ``DD`` dimensions, the
    dimension sizes as big-endian uint32, then the big-endian data. Gzip is
    detected from the content, so ``.gz`` and plain files are both accepted.

    Args:
        path: File to read.

    Returns:
        Array of shape given by the header, native byte order, with dtype
        uint8 / int8 / int16 / int32 / float32 / float64 for type codes
        0x08 / 0x09 / 0x0B / 0x0C / 0x0D / 0x0E.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        DataFormatError: bad magic number, unknown type code, zero dimensions, or
            a file length that differs from what the header implies (truncated or
            with trailing bytes); also a corrupt gzip stream.
    """
    return _read_idx(Path(path))[0]


def _file_names(split: str) -> tuple[list[str], list[str]]:
    prefix = _PREFIX[split]
    images = f"{prefix}-images-idx3-ubyte"
    labels = f"{prefix}-labels-idx1-ubyte"
    return [images, images + ".gz"], [labels, labels + ".gz"]


def _check_split_kind(split: str, kind: str) -> None:
    if split not in _PREFIX:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if kind not in ("mnist", "fashion-mnist"):
        raise ValueError(f"kind must be 'mnist' or 'fashion-mnist', got {kind!r}")


def _find_pair(directory: Path, split: str) -> tuple[Path | None, Path | None]:
    image_names, label_names = _file_names(split)
    return find_first(directory, image_names), find_first(directory, label_names)


def _missing_message(
    kind: str,
    split: str,
    dirs: list[Path],
    *,
    explicit: bool,
    partial: list[str],
    fallbacks: tuple[Path, ...] = (),
) -> str:
    files = ", ".join(f"{name}[.gz]" for name in _ALL_FILES)
    subdir = kind
    lines = [
        f"{'Fashion-MNIST' if kind == 'fashion-mnist' else 'MNIST'} ({split} split) not found. "
        "Searched:",
        describe_searched(dirs, subdir, explicit=explicit, fallbacks=fallbacks),
    ]
    lines.extend(partial)
    if kind == "fashion-mnist":
        lines.append(
            "To get it, install the Debian package: apt-get install dataset-fashion-mnist "
            f"(files go to {FASHION_MNIST_SYSTEM_DIR}/), or pass path=DIR holding the IDX "
            f"files {files}, or set {DATA_ENV_VAR}=ROOT with them in ROOT/{subdir}/."
        )
    else:
        lines.append(
            f"Put the four IDX files of LeCun's MNIST database, {files} (plain or gzipped), "
            f"in a directory and pass path=DIR, or set {DATA_ENV_VAR}=ROOT with them in "
            f"ROOT/{subdir}/. No Debian package ships MNIST."
        )
    lines.append("This library never downloads data.")
    return "\n".join(lines)


def _load_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images, magic = _read_idx(images_path)
    if magic != _IMAGES_MAGIC:
        raise DataFormatError(
            f"{images_path}: expected an IDX image file with magic number "
            f"0x{_IMAGES_MAGIC:08X} (unsigned bytes, 3 dimensions), found 0x{magic:08X}"
        )
    labels, magic = _read_idx(labels_path)
    if magic != _LABELS_MAGIC:
        raise DataFormatError(
            f"{labels_path}: expected an IDX label file with magic number "
            f"0x{_LABELS_MAGIC:08X} (unsigned bytes, 1 dimension), found 0x{magic:08X}"
        )
    if labels.shape[0] != images.shape[0]:
        raise DataFormatError(
            f"{labels_path}: label count {labels.shape[0]} does not match image count "
            f"{images.shape[0]} in {images_path}"
        )
    if labels.size and int(labels.max()) >= _NUM_CLASSES:
        raise DataFormatError(
            f"{labels_path}: label {int(labels.max())} is out of range 0..{_NUM_CLASSES - 1}"
        )
    # k / 255 in float32 is correctly rounded, so pixel values are reproducible.
    return images.astype(np.float32) / np.float32(255.0), labels.astype(np.int32)


def load_mnist_like(
    path: str | os.PathLike[str], split: Split = "train", kind: Kind = "mnist"
) -> tuple[np.ndarray, np.ndarray]:
    """Load one split of an MNIST-format dataset from a directory.

    Looks in ``path`` (only there) for ``train-images-idx3-ubyte`` and
    ``train-labels-idx1-ubyte`` (``split="train"``) or ``t10k-images-idx3-ubyte``
    and ``t10k-labels-idx1-ubyte`` (``split="test"``), each plain or with a
    ``.gz`` suffix (plain preferred when both exist). File format: IDX, see
    :func:`read_idx`.

    Args:
        path: Directory holding the IDX files.
        split: ``"train"`` (60,000 examples for MNIST and Fashion-MNIST) or
            ``"test"`` (10,000).
        kind: ``"mnist"`` or ``"fashion-mnist"``; only changes the advice given
            when files are missing (both datasets share names and format).

    Returns:
        ``(images, labels)``: images float32 of shape ``(n, H, W)`` (``(n, 28, 28)``
        for both datasets) with pixel values scaled to [0, 1] by ``/255``, and
        labels int32 of shape ``(n,)`` in 0..9. Memory: 60,000 training images
        take 188 MB as float32.

    Raises:
        DatasetNotFoundError: an image or label file of the split is missing.
        DataFormatError: a file is not a valid IDX image/label file, label count
            differs from image count, or a label is outside 0..9.
    """
    _check_split_kind(split, kind)
    directory = Path(path).expanduser()
    images_path, labels_path = _find_pair(directory, split)
    if images_path is None or labels_path is None:
        partial = _partial_notes(directory, images_path, labels_path)
        raise DatasetNotFoundError(
            _missing_message(kind, split, [directory], explicit=True, partial=partial)
        )
    return _load_pair(images_path, labels_path)


def _partial_notes(directory: Path, images: Path | None, labels: Path | None) -> list[str]:
    # A directory with one file of the pair usually means an interrupted copy;
    # saying so saves the user from hunting for the wrong problem.
    if (images is None) == (labels is None):
        return []
    found = images or labels
    return [f"Note: {directory} has {found.name} but not its companion file."]


def _load_searching(
    kind: Kind, split: Split, path: str | os.PathLike[str] | None, fallbacks: tuple[Path, ...]
) -> tuple[np.ndarray, np.ndarray]:
    _check_split_kind(split, kind)
    dirs = candidate_dirs(path, kind, fallbacks)
    partial: list[str] = []
    for directory in dirs:
        images_path, labels_path = _find_pair(directory, split)
        if images_path is not None and labels_path is not None:
            return _load_pair(images_path, labels_path)
        partial.extend(_partial_notes(directory, images_path, labels_path))
    raise DatasetNotFoundError(
        _missing_message(
            kind, split, dirs, explicit=path is not None, partial=partial, fallbacks=fallbacks
        )
    )


def load_fashion_mnist(
    split: Split = "train", path: str | os.PathLike[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load Fashion-MNIST (Xiao, Rasul & Vollgraf, 2017, arXiv:1708.07747).

    10 classes of 28x28 grayscale Zalando article images (names in
    :data:`FASHION_MNIST_CLASSES`); 60,000 training and 10,000 test examples, in
    the MNIST IDX format and file names.

    Search order: ``path`` if given (and then nothing else); otherwise
    ``$BILEVEL_DATA/fashion-mnist`` if ``BILEVEL_DATA`` is set, then
    ``/usr/share/datasets/fashion-mnist`` where the Debian package
    ``dataset-fashion-mnist`` installs the four ``*-ubyte.gz`` files (skipped when
    ``$BILEVEL_IGNORE_SYSTEM_DATA`` is ``1``).

    Args:
        split: ``"train"`` or ``"test"``.
        path: Directory holding the IDX files (plain or ``.gz``).

    Returns:
        ``(images, labels)`` as in :func:`load_mnist_like`: float32
        ``(n, 28, 28)`` in [0, 1] and int32 ``(n,)`` in 0..9.

    Raises:
        DatasetNotFoundError: not found; the message says to run
            ``apt-get install dataset-fashion-mnist`` or pass ``path=``.
        DataFormatError: a file is malformed.
    """
    return _load_searching("fashion-mnist", split, path, (FASHION_MNIST_SYSTEM_DIR,))


def load_mnist(
    split: Split = "train", path: str | os.PathLike[str] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load MNIST (LeCun, Cortes & Burges, http://yann.lecun.com/exdb/mnist/).

    10 classes of 28x28 grayscale handwritten digits; 60,000 training and 10,000
    test examples in the IDX format.

    Search order: ``path`` if given (and then nothing else); otherwise
    ``$BILEVEL_DATA/mnist`` if ``BILEVEL_DATA`` is set. There is no system-wide
    location: no Debian package ships MNIST.

    Args:
        split: ``"train"`` or ``"test"``.
        path: Directory holding ``train-images-idx3-ubyte``,
            ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte`` and
            ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``).

    Returns:
        ``(images, labels)`` as in :func:`load_mnist_like`.

    Raises:
        DatasetNotFoundError: not found; the message names the expected files.
        DataFormatError: a file is malformed.
    """
    return _load_searching("mnist", split, path, ())
