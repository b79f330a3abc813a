"""Which data an experiment runs on: the paper's when the user has it, else a named stand-in.

Every function returns the arrays with the dataset's name and a sentence that the experiment
writes into its outputs, saying plainly which dataset was used and, when it is a substitute,
how to get the real one. The stand-ins differ in size by orders of magnitude (Fashion-MNIST
60000 + 10000 images, scikit-learn digits 1797), so experiments size their splits from the
arrays they get, never from the paper's dataset sizes, and say so when they cut a split.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from bilevel import data

__all__ = ["ImageData", "mnist_or_substitute", "why_no_system_data"]


@dataclasses.dataclass(frozen=True)
class ImageData:
    """Train and test images in [0, 1] of shape (n, H, W), their labels, and what they are.

    ``name`` is the dataset actually loaded ("MNIST", "Fashion-MNIST" or "scikit-learn
    digits"): experiments that describe the data in their own words (E5) use it, so no
    output names a dataset the run did not use.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    name: str
    note: str

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(train_images, train_labels, test_images, test_labels)``."""
        return self.train_images, self.train_labels, self.test_images, self.test_labels


def why_no_system_data() -> str:
    """The reason machine-wide data was not used, for stand-in notes.

    With ``$BILEVEL_IGNORE_SYSTEM_DATA`` set, "not installed" may be false: the note says the
    data was ignored instead.
    """
    if data.system_data_ignored():
        return f"system-wide data is ignored (${data.IGNORE_SYSTEM_ENV_VAR}=1)"
    return "it is not installed"


def mnist_or_substitute(log: Callable[[str], None] = print) -> ImageData:
    """MNIST if the user provides it; else Fashion-MNIST; else scikit-learn digits."""
    try:
        tr = data.load_mnist("train")
        te = data.load_mnist("test")
        return ImageData(*tr, *te, "MNIST", "MNIST (the paper's dataset).")
    except data.DatasetNotFoundError as err:
        log(f"MNIST not found, using a stand-in. {err}")
    try:
        tr = data.load_fashion_mnist("train")
        te = data.load_fashion_mnist("test")
        return ImageData(
            *tr,
            *te,
            "Fashion-MNIST",
            "SUBSTITUTE: Fashion-MNIST ($BILEVEL_DATA/fashion-mnist or the Debian package "
            "dataset-fashion-mnist) stands in for MNIST, which cannot be downloaded here; put "
            "the four MNIST IDX files in $BILEVEL_DATA/mnist to run on MNIST. Fashion-MNIST is "
            "harder, so absolute accuracies are lower than the paper's.",
        )
    except data.DatasetNotFoundError as err:
        log(f"Fashion-MNIST not found either, using scikit-learn digits. {err}")
    return _digits()


def _digits() -> ImageData:
    """scikit-learn's 1797 8x8 digits, upsampled to 32x32 (LeNet's input), split 70 / 30."""
    X, y = data.load_sklearn("digits")
    images = X.reshape(-1, 8, 8) / 16.0
    images = np.kron(images, np.ones((1, 4, 4), np.float32))  # 32x32: LeNet's input size
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    cut = int(0.7 * len(y))
    tr, te = order[:cut], order[cut:]
    return ImageData(
        images[tr],
        y[tr],
        images[te],
        y[te],
        "scikit-learn digits",
        f"SUBSTITUTE: scikit-learn digits (1797 images, 8x8 upsampled to 32x32; {cut} train, "
        f"{len(y) - cut} test) stand in for MNIST: MNIST is not provided and Fashion-MNIST "
        f"is not used because {why_no_system_data()} (to use it: apt-get install "
        "dataset-fashion-mnist, or its IDX files in $BILEVEL_DATA/fashion-mnist); split sizes "
        "are capped by this small set.",
    )
