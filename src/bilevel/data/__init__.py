"""Dataset loading and preparation for bilevel experiments (numpy only).

Loaders return numpy arrays: float32 features and int32 labels (except
:func:`read_libsvm`, which returns labels as written, float32, and
:func:`load_20newsgroups`, :func:`load_news20_libsvm` and :func:`load_newsgroups`, which
return scipy sparse matrices). Nothing here downloads data: loaders look in local
directories (``path=``, the data root ``$BILEVEL_DATA``, system locations such as the
Debian package ``dataset-fashion-mnist``) and raise :class:`DatasetNotFoundError` explaining how
to obtain the files when they are absent. Nothing here unpickles a file the caller has not
said they trust (:func:`load_miniimagenet`'s ``trust_pickle``).

``BILEVEL_IGNORE_SYSTEM_DATA=1`` makes every loader ignore data that is there
only because of an install on this machine: system-wide locations
(``/usr/share/datasets/...``) and scikit-learn's download cache (20 Newsgroups).
``$BILEVEL_DATA`` and explicit ``path=`` arguments still work. It exists so that
a machine with that data can show what one without it does: which stand-in an
experiment takes and what its outputs then say (the tests set it). The data
bundled inside the scikit-learn wheel (:func:`load_sklearn`) is part of a
dependency, not of the machine, and stays available.
"""

from __future__ import annotations

from bilevel.data._paths import DATA_ENV_VAR, IGNORE_SYSTEM_ENV_VAR, system_data_ignored
from bilevel.data.errors import DataFormatError, DatasetNotFoundError
from bilevel.data.idx import (
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_SYSTEM_DIR,
    load_fashion_mnist,
    load_mnist,
    load_mnist_like,
    read_idx,
)
from bilevel.data.libsvm import (
    LIBSVM_DATASETS,
    load_libsvm_dataset,
    read_libsvm,
    read_libsvm_entries,
)
from bilevel.data.miniimagenet import (
    MINIIMAGENET_SPLITS,
    TRUST_PICKLE_ENV_VAR,
    MiniImageNetSplit,
    UntrustedPickleError,
    convert_miniimagenet_to_npz,
    load_miniimagenet,
    pickle_trusted_by_env,
)
from bilevel.data.newsgroups import Newsgroups, load_news20_libsvm, load_newsgroups
from bilevel.data.sklearn_sets import SKLEARN_DATASETS, load_20newsgroups, load_sklearn
from bilevel.data.splits import (
    binary_from_multiclass,
    corrupt_labels,
    one_hot,
    train_val_test_split,
)
from bilevel.data.synthetic import downsample_images, standardize

__all__ = [
    "DATA_ENV_VAR",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_SYSTEM_DIR",
    "IGNORE_SYSTEM_ENV_VAR",
    "LIBSVM_DATASETS",
    "MINIIMAGENET_SPLITS",
    "MiniImageNetSplit",
    "Newsgroups",
    "SKLEARN_DATASETS",
    "TRUST_PICKLE_ENV_VAR",
    "UntrustedPickleError",
    "DataFormatError",
    "DatasetNotFoundError",
    "binary_from_multiclass",
    "convert_miniimagenet_to_npz",
    "corrupt_labels",
    "downsample_images",
    "load_20newsgroups",
    "load_fashion_mnist",
    "load_libsvm_dataset",
    "load_miniimagenet",
    "load_mnist",
    "load_mnist_like",
    "load_news20_libsvm",
    "load_newsgroups",
    "load_sklearn",
    "one_hot",
    "pickle_trusted_by_env",
    "read_idx",
    "read_libsvm",
    "read_libsvm_entries",
    "standardize",
    "system_data_ignored",
    "train_val_test_split",
]
