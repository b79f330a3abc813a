"""miniImageNet (Vinyals et al., "Matching Networks for One Shot Learning", NeurIPS 2016).

100 ImageNet classes x 600 colour images of 84x84, split by class as Ravi & Larochelle
("Optimization as a Model for Few-Shot Learning", ICLR 2017): 64 meta-train, 16 meta-validation
and 20 meta-test classes. PZOBO's few-shot experiment (Sow, Ji, Liang, NeurIPS 2022, Sec. 4.3
and App. B.4) uses it through learn2learn.
It cannot be downloaded here; users bring one of two common pickle layouts:

* learn2learn: ``mini-imagenet-cache-{train,validation,test}.pkl``, each a dict with
  ``"image_data"`` ``(n, 84, 84, 3)`` uint8 and ``"class_dict"`` ``{class name: [row indices]}``;
* MetaOptNet (Lee et al., CVPR 2019):
  ``miniImageNet_category_split_{train_phase_train,val,test}.pickle``, each a dict with
  ``"data"`` ``(n, 84, 84, 3)`` uint8, ``"labels"`` ``(n,)`` and optionally
  ``"catname2label"``; pickled under Python 2, so read with ``encoding="latin1"``.

Unpickling a file runs whatever code the file names, so a pickle is read only when the caller
passes ``trust_pickle=True``. :func:`convert_miniimagenet_to_npz` converts the pickles once
into ``miniimagenet-{train,val,test}.npz`` (arrays ``images``, ``labels``, ``class_names``),
which :func:`load_miniimagenet` prefers and reads with ``allow_pickle=False``: plain arrays,
no code.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from bilevel.data._paths import (
    DATA_ENV_VAR,
    candidate_dirs,
    describe_searched,
    env_flag,
    find_first,
)
from bilevel.data.errors import DataFormatError, DatasetNotFoundError

__all__ = [
    "MINIIMAGENET_SPLITS",
    "MiniImageNetSplit",
    "TRUST_PICKLE_ENV_VAR",
    "UntrustedPickleError",
    "convert_miniimagenet_to_npz",
    "load_miniimagenet",
    "pickle_trusted_by_env",
]

Split = Literal["train", "val", "test"]

#: the three class-disjoint splits (64 / 16 / 20 classes)
MINIIMAGENET_SPLITS: tuple[str, ...] = ("train", "val", "test")

#: Environment variable that, set to ``1``, says the user trusts the miniImageNet pickles in the
#: data root: read by callers that load on a user's behalf (the few-shot experiment), never by
#: :func:`load_miniimagenet` itself, which takes only its explicit ``trust_pickle`` argument.
TRUST_PICKLE_ENV_VAR = "BILEVEL_TRUST_PICKLE"

_SUBDIR = "miniimagenet"
_IMAGE_SHAPE = (84, 84, 3)
_NPZ = {s: f"miniimagenet-{s}.npz" for s in MINIIMAGENET_SPLITS}
_L2L = {
    s: f"mini-imagenet-cache-{t}.pkl"
    for s, t in zip(MINIIMAGENET_SPLITS, ("train", "validation", "test"), strict=True)
}
_METAOPTNET = {
    s: f"miniImageNet_category_split_{t}.pickle"
    for s, t in zip(MINIIMAGENET_SPLITS, ("train_phase_train", "val", "test"), strict=True)
}


class UntrustedPickleError(ValueError):
    """Only a pickle holds the data, and the caller did not say it trusts the file.

    Unpickling runs code named in the file (``pickle`` documentation, "Warning: The pickle
    module is not secure"). The message names the file and both ways forward.
    """


class MiniImageNetSplit(NamedTuple):
    """One split of miniImageNet as stored: label ``c`` is class ``class_names[c]``."""

    images: np.ndarray  # (n, 84, 84, 3) uint8, HWC as in the files
    labels: np.ndarray  # (n,) int32 in 0..n_classes-1
    class_names: tuple[str, ...]  # e.g. WordNet ids "n01532829" (learn2learn)


def pickle_trusted_by_env() -> bool:
    """Whether ``$BILEVEL_TRUST_PICKLE`` is ``1`` / ``true`` / ``yes`` / ``on`` (else false)."""
    return env_flag(TRUST_PICKLE_ENV_VAR, "trust the miniImageNet pickles in $BILEVEL_DATA")


def _check_split(split: str) -> None:
    if split not in MINIIMAGENET_SPLITS:
        raise ValueError(f"split must be one of {MINIIMAGENET_SPLITS}, got {split!r}")


def _check_images(path: Path, images) -> np.ndarray:
    if not isinstance(images, np.ndarray) or images.ndim != 4 or images.shape[1:] != _IMAGE_SHAPE:
        shape = getattr(images, "shape", type(images).__name__)
        raise DataFormatError(f"{path}: images must be an array (n, 84, 84, 3), got {shape}")
    if images.dtype != np.uint8:
        raise DataFormatError(f"{path}: images must be uint8 pixels 0..255, got {images.dtype}")
    return images


def _checked(path: Path, images, labels, names) -> MiniImageNetSplit:
    """The split, after the checks every layout shares (shape, dtype, labels, classes)."""
    images = _check_images(path, images)
    labels = np.asarray(labels)
    if labels.shape != (images.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise DataFormatError(
            f"{path}: expected {images.shape[0]} integer labels (one per image), got "
            f"{labels.dtype} {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= len(names)):
        raise DataFormatError(
            f"{path}: labels {labels.min()}..{labels.max()} outside 0..{len(names) - 1}"
        )
    empty = [names[c] for c in np.flatnonzero(np.bincount(labels, minlength=len(names)) == 0)]
    if empty or not names:
        raise DataFormatError(f"{path}: no images for classes {empty or 'at all'}")
    return MiniImageNetSplit(images, labels.astype(np.int32), tuple(str(n) for n in names))


def _unpickle(path: Path) -> dict:
    try:
        with path.open("rb") as f:
            # latin1: MetaOptNet's files were pickled by Python 2, whose str (numpy's raw array
            # bytes among them) must come back byte for byte; Python 3 pickles are unaffected.
            obj = pickle.load(f, encoding="latin1")
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as exc:
        raise DataFormatError(f"{path}: not a readable pickle ({exc})") from exc
    if not isinstance(obj, dict):
        raise DataFormatError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def _require(path: Path, obj: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise DataFormatError(f"{path}: missing keys {missing}; found {sorted(map(str, obj))}")


def _read_l2l(path: Path) -> MiniImageNetSplit:
    obj = _unpickle(path)
    _require(path, obj, ("image_data", "class_dict"))
    images, class_dict = _check_images(path, obj["image_data"]), obj["class_dict"]
    if not isinstance(class_dict, dict):
        raise DataFormatError(f"{path}: class_dict must be a dict, got {type(class_dict).__name__}")
    n = images.shape[0]
    labels = np.full(n, -1, np.int64)
    names = sorted(class_dict)  # sorted names: labels independent of the dict's order
    for c, name in enumerate(names):
        rows = np.asarray(class_dict[name], dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise DataFormatError(f"{path}: class {name!r} lists rows outside 0..{n - 1}")
        if np.any(labels[rows] != -1):
            raise DataFormatError(f"{path}: class {name!r} shares rows with another class")
        labels[rows] = c
    if np.any(labels == -1):
        raise DataFormatError(
            f"{path}: rows {np.flatnonzero(labels == -1)[:5].tolist()}... belong to no class"
        )
    return _checked(path, images, labels, names)


def _read_metaoptnet(path: Path) -> MiniImageNetSplit:
    obj = _unpickle(path)
    _require(path, obj, ("data", "labels"))
    raw = np.asarray(obj["labels"])
    if raw.ndim != 1 or not np.issubdtype(raw.dtype, np.integer):
        raise DataFormatError(f"{path}: labels must be 1-D integers, got {raw.dtype} {raw.shape}")
    ids, labels = np.unique(raw, return_inverse=True)
    id_to_name = {int(v): str(k) for k, v in obj.get("catname2label", {}).items()}
    names = [id_to_name.get(int(i), str(int(i))) for i in ids]
    return _checked(path, obj["data"], labels, names)


def _read_npz(path: Path) -> MiniImageNetSplit:
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:  # object arrays need pickle: refused
        raise DataFormatError(f"{path}: not an npz file of plain arrays ({exc})") from exc
    _require(path, arrays, ("images", "labels", "class_names"))
    images, labels, names = arrays["images"], arrays["labels"], arrays["class_names"]
    if names.ndim != 1 or names.dtype.kind != "U":
        raise DataFormatError(f"{path}: class_names must be a 1-D string array, got {names.dtype}")
    return _checked(path, images, labels, list(names))


def _untrusted_message(pickles: list[Path]) -> str:
    files = ", ".join(map(str, pickles))
    return (
        f"miniImageNet is here only as pickle ({files}). Unpickling a file runs code it names, "
        "so it is read only on request: pass trust_pickle=True if you trust the file (its "
        "source), or convert it once -- bilevel.data.convert_miniimagenet_to_npz(SRC_DIR, "
        "DST_DIR, trust_pickle=True) -- after which every load reads the npz files as plain "
        "arrays, no code run."
    )


def _missing_message(split: str, dirs: list[Path], explicit: bool) -> str:
    return "\n".join(
        [
            f"miniImageNet ({split} split) not found. Searched:",
            describe_searched(dirs, _SUBDIR, explicit=explicit),
            f"Expected {_NPZ[split]} (see convert_miniimagenet_to_npz), or the pickle "
            f"{_L2L[split]} (learn2learn's layout) or {_METAOPTNET[split]} (MetaOptNet's). "
            f"Put the files in a directory and pass path=DIR, or set {DATA_ENV_VAR}=ROOT with "
            f"them in ROOT/{_SUBDIR}/. This library never downloads data.",
        ]
    )


def load_miniimagenet(
    split: Split = "train",
    path: str | os.PathLike[str] | None = None,
    *,
    trust_pickle: bool = False,
) -> MiniImageNetSplit:
    """Load one split of miniImageNet (module docstring: layouts and why pickles need trust).

    Search order: ``path`` if given (and then nothing else); otherwise
    ``$BILEVEL_DATA/miniimagenet``. In a directory, ``miniimagenet-{split}.npz`` is preferred
    (read with ``allow_pickle=False``), then learn2learn's pickle, then MetaOptNet's.

    Args:
        split: ``"train"`` (64 classes), ``"val"`` (16) or ``"test"`` (20).
        path: Directory holding the files.
        trust_pickle: read a pickle if no npz is there. Only for files you trust: unpickling
            runs code named in the file.

    Returns:
        :class:`MiniImageNetSplit`: uint8 ``(n, 84, 84, 3)`` images, int32 labels relabelled
        ``0..k-1`` in sorted order of the file's class names (learn2learn) or class ids
        (MetaOptNet), and the class names.

    Raises:
        DatasetNotFoundError: no file of the split; the message lists where it looked.
        UntrustedPickleError: only a pickle is there and ``trust_pickle`` is false.
        DataFormatError: a file is unreadable, lacks a key, or has images that are not
            uint8 84x84x3, labels out of range or a class without images.
    """
    _check_split(split)
    dirs = candidate_dirs(path, _SUBDIR)
    untrusted: list[Path] = []
    for directory in dirs:
        npz = find_first(directory, [_NPZ[split]])
        if npz is not None:
            return _read_npz(npz)
        for name, reader in ((_L2L[split], _read_l2l), (_METAOPTNET[split], _read_metaoptnet)):
            found = find_first(directory, [name])
            if found is None:
                continue
            if trust_pickle:
                return reader(found)
            untrusted.append(found)
    if untrusted:
        raise UntrustedPickleError(_untrusted_message(untrusted))
    raise DatasetNotFoundError(_missing_message(split, dirs, explicit=path is not None))


def convert_miniimagenet_to_npz(
    src_dir: str | os.PathLike[str], dst_dir: str | os.PathLike[str], *, trust_pickle: bool
) -> list[Path]:
    """Convert miniImageNet's pickles once into npz files that load without running code.

    Reads the three splits from ``src_dir`` (either pickle layout, module docstring) and writes
    ``dst_dir/miniimagenet-{train,val,test}.npz`` with arrays ``images`` (uint8
    ``(n, 84, 84, 3)``), ``labels`` (int32) and ``class_names`` (strings), each written to a
    temporary name and then renamed, so an interrupted run leaves no half file. Point
    ``$BILEVEL_DATA/miniimagenet`` (or ``path=``) at ``dst_dir`` afterwards.

    Args:
        src_dir: Directory with the pickles.
        dst_dir: Directory for the npz files (created if absent; may equal ``src_dir``).
        trust_pickle: must be ``True``: you vouch for the pickles, which are unpickled here.

    Returns:
        The three paths written, in split order.

    Raises:
        UntrustedPickleError: ``trust_pickle`` is false (and ``src_dir`` holds pickles only).
        DatasetNotFoundError, DataFormatError: as :func:`load_miniimagenet`.
    """
    dst = Path(dst_dir).expanduser()
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for split in MINIIMAGENET_SPLITS:
        data = load_miniimagenet(split, src_dir, trust_pickle=trust_pickle)
        target = dst / _NPZ[split]
        tmp = target.with_name(target.name + ".partial.npz")
        np.savez(
            tmp,
            images=data.images,
            labels=data.labels,
            class_names=np.array(data.class_names, dtype=str),
        )
        os.replace(tmp, target)
        written.append(target)
    return written
