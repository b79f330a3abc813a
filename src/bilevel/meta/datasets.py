"""Which few-shot data the meta-learning experiment runs on: miniImageNet, or a named stand-in.

PZOBO's few-shot experiment (Sow, Ji, Liang, NeurIPS 2022, Sec. 4.3, Table 1, App. B.4) uses
miniImageNet's 64 / 16 / 20 class split with 5-way tasks. It cannot be downloaded here, so
:func:`few_shot_data` takes, in order:

1. miniImageNet from ``$BILEVEL_DATA/miniimagenet`` (npz files, or the pickles when the user
   trusts them: ``few_shot_data(trust_pickle=True)`` or ``$BILEVEL_TRUST_PICKLE=1``),
   normalised with the official code's fixed per-channel mean and std;
2. else Fashion-MNIST (Xiao, Rasul, Vollgraf 2017): meta-train classes 0-5 and meta-test
   classes 6-9, both from the 60k training file; meta-validation is the meta-train classes'
   images of the 10k test file, i.e. NEW IMAGES OF THE TRAINING CLASSES, not new classes (the
   four remaining classes are all needed to make 4-way meta-test tasks); 28x28 zero-padded to
   32x32, so CNN4's four 2x2 pools leave 2x2x32 = 128 features;
3. else scikit-learn's digits (bundled with scikit-learn), 8x8 upsampled to 32x32, with the same
   6 / 4 class split and a held-out third of the training digits' images as meta-validation.

Every split is normalised per channel with meta-train statistics (:func:`~bilevel.meta.episodes.
normalize_splits`). The returned ``note`` says which data was used, its class split and ways,
and for a stand-in how to get miniImageNet; the experiment writes it into its outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from bilevel import data
from bilevel.data.standins import why_no_system_data
from bilevel.meta.episodes import FewShotSplit, normalize_splits, split_by_classes

__all__ = [
    "FewShotData",
    "few_shot_data",
    "MINIIMAGENET_MEAN",
    "MINIIMAGENET_STD",
    "MAX_WAYS",
]

#: the official code's per-channel normalisation for miniImageNet (App. B.4 normalises "by their
#: means and standard deviations over RGB channels" without the values), on [0, 1] pixels
MINIIMAGENET_MEAN = (120.396 / 255, 115.594 / 255, 104.540 / 255)
MINIIMAGENET_STD = (70.682 / 255, 68.276 / 255, 72.545 / 255)

#: the paper's 5-way tasks; a stand-in whose meta-test split has fewer classes uses all of them
MAX_WAYS = 5

_META_TRAIN, _META_TEST = range(6), range(6, 10)  # the stand-ins' class split

_GET_MINIIMAGENET = (
    "to run on miniImageNet, put learn2learn's mini-imagenet-cache-{train,validation,test}.pkl "
    "(or MetaOptNet's miniImageNet_category_split_*.pickle) in $BILEVEL_DATA/miniimagenet and "
    "either convert them once with bilevel.data.convert_miniimagenet_to_npz or set "
    "$BILEVEL_TRUST_PICKLE=1"
)


@dataclasses.dataclass(frozen=True, eq=False)
class FewShotData:
    """Class-disjoint meta-train / meta-val / meta-test splits, and what they are.

    ``ways`` is the largest way every split allows, capped at the paper's 5; ``note`` is a
    sentence for the experiment's outputs (module docstring).
    """

    train: FewShotSplit
    val: FewShotSplit
    test: FewShotSplit
    name: str  # "miniImageNet", "Fashion-MNIST" or "scikit-learn digits"
    note: str
    ways: int


def few_shot_data(
    log: Callable[[str], None] = print, *, trust_pickle: bool | None = None
) -> FewShotData:
    """miniImageNet if the user provides it; else Fashion-MNIST; else scikit-learn digits.

    Args:
        log: receives one line saying why a dataset was passed over.
        trust_pickle: read miniImageNet's pickles (they run code when unpickled) if no npz
            files are there; ``None`` reads ``$BILEVEL_TRUST_PICKLE`` (``1`` = trust).
    """
    if trust_pickle is None:
        trust_pickle = data.pickle_trusted_by_env()
    try:
        return _miniimagenet(trust_pickle)
    except (data.DatasetNotFoundError, data.UntrustedPickleError) as err:
        log(f"miniImageNet not used, taking a stand-in. {err}")
    try:
        return _fashion_mnist()
    except data.DatasetNotFoundError as err:
        log(f"Fashion-MNIST not found either, using scikit-learn digits. {err}")
    return _digits()


def _ways(*splits: FewShotSplit) -> int:
    return min(MAX_WAYS, *(s.n_classes for s in splits))


def _describe(split: FewShotSplit) -> str:
    ids, names = split.class_ids, ", ".join(split.class_names)
    return f"classes {ids.min()}-{ids.max()} ({names}), {len(split.labels)} images"


def _miniimagenet(trust_pickle: bool) -> FewShotData:
    splits, offset = [], 0
    for name in data.MINIIMAGENET_SPLITS:
        raw = data.load_miniimagenet(name, trust_pickle=trust_pickle)
        images = raw.images.transpose(0, 3, 1, 2).astype(np.float32)  # NHWC uint8 -> NCHW
        images /= np.float32(255.0)
        k = len(raw.class_names)
        ids = np.arange(offset, offset + k)
        splits.append(FewShotSplit(images, raw.labels, ids, raw.class_names))
        offset += k
    train, val, test = normalize_splits(*splits, mean=MINIIMAGENET_MEAN, std=MINIIMAGENET_STD)
    ways = _ways(train, val, test)
    note = (
        f"miniImageNet (the paper's dataset): {train.n_classes} / {val.n_classes} / "
        f"{test.n_classes} meta-train / meta-val / meta-test classes ({len(train.labels)} / "
        f"{len(val.labels)} / {len(test.labels)} images of 84x84x3), {ways}-way tasks, pixels "
        "normalised with the official code's per-channel mean and std."
    )
    return FewShotData(train, val, test, "miniImageNet", note, ways)


def _pad_to_32(images: np.ndarray) -> np.ndarray:
    """(n, 28, 28) -> (n, 1, 32, 32) with a zero border of 2 pixels."""
    return np.pad(images[:, None], ((0, 0), (0, 0), (2, 2), (2, 2)))


def _fashion_mnist() -> FewShotData:
    names = data.FASHION_MNIST_CLASSES
    train_x, train_y = data.load_fashion_mnist("train")
    test_x, test_y = data.load_fashion_mnist("test")
    train, test = split_by_classes(_pad_to_32(train_x), train_y, [_META_TRAIN, _META_TEST], names)
    (val,) = split_by_classes(_pad_to_32(test_x), test_y, [_META_TRAIN], names)
    train, val, test = normalize_splits(train, val, test)
    ways = _ways(train, val, test)
    note = (
        f"SUBSTITUTE: Fashion-MNIST stands in for miniImageNet, which is not provided "
        f"({_GET_MINIIMAGENET}). Meta-train: {_describe(train)} of the 60k training file; "
        f"meta-test: {_describe(test)} of the same file, classes never seen in meta-training; "
        f"meta-validation: the meta-train classes' {len(val.labels)} images of the 10k test "
        "file, i.e. new images of the training classes, not new classes. "
        f"{ways}-way tasks (the meta-test split has {test.n_classes} classes); 28x28 images "
        "zero-padded to 32x32, 1 channel, normalised with meta-train mean and std."
    )
    return FewShotData(train, val, test, "Fashion-MNIST", note, ways)


def _held_out_third(labels: np.ndarray, classes, seed: int = 0) -> np.ndarray:
    """Mask of a random third of each of ``classes``' images (seeded)."""
    rng = np.random.default_rng(seed)
    held = np.zeros(labels.shape, bool)
    for c in classes:
        rows = rng.permutation(np.flatnonzero(labels == c))
        held[rows[: len(rows) // 3]] = True
    return held


def _digits() -> FewShotData:
    X, y = data.load_sklearn("digits")
    images = np.kron(X.reshape(-1, 1, 8, 8) / np.float32(16.0), np.ones((1, 1, 4, 4), np.float32))
    names = tuple(str(d) for d in range(10))
    held = _held_out_third(y, _META_TRAIN)
    (train,) = split_by_classes(images[~held], y[~held], [_META_TRAIN], names)
    (val,) = split_by_classes(images[held], y[held], [_META_TRAIN], names)
    (test,) = split_by_classes(images, y, [_META_TEST], names)
    train, val, test = normalize_splits(train, val, test)
    ways = _ways(train, val, test)
    note = (
        "SUBSTITUTE: scikit-learn digits (1797 8x8 images upsampled to 32x32, 1 channel) stand "
        f"in for miniImageNet, which is not provided ({_GET_MINIIMAGENET}); Fashion-MNIST, the "
        f"usual stand-in, is not used because {why_no_system_data()} (to use it: apt-get "
        "install dataset-fashion-mnist, or its IDX files in $BILEVEL_DATA/fashion-mnist). "
        f"Meta-train: digits {_describe(train)}; meta-validation: a held-out third of those "
        f"digits' images ({len(val.labels)}; new images of the training classes, not new "
        f"classes); meta-test: digits {_describe(test)}, never seen in meta-training. "
        f"{ways}-way tasks; normalised with meta-train mean and std. This set is tiny: "
        "accuracies are not comparable with the paper's."
    )
    return FewShotData(train, val, test, "scikit-learn digits", note, ways)
