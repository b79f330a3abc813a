"""Generic array transforms used when preparing datasets.

Nothing domain-specific lives here yet: image down-sampling (to make MNIST-size
problems small enough for exact reference solutions) and feature standardization.
"""

from __future__ import annotations

import numpy as np

__all__ = ["downsample_images", "standardize"]

_STD_FLOOR = 1e-8


def downsample_images(images: np.ndarray, factor: int) -> np.ndarray:
    """Mean-pool images over non-overlapping ``factor x factor`` blocks.

    Pools the last two axes, so ``(n, H, W)`` becomes ``(n, H/factor, W/factor)``
    (any leading axes are kept); e.g. 28x28 MNIST images with ``factor=4`` give
    7x7. Each output pixel is the mean of its block, so values stay in the input
    range ([0, 1] for the loaders' images).

    Args:
        images: Array of shape ``(..., H, W)``.
        factor: Positive integer dividing both ``H`` and ``W``.

    Returns:
        Pooled array of shape ``(..., H // factor, W // factor)``; floating
        inputs keep their dtype, integer inputs become float32.

    Raises:
        ValueError: ``factor`` not a positive integer, fewer than 2 axes, or
            ``H`` / ``W`` not divisible by ``factor``.
    """
    if isinstance(factor, bool) or not isinstance(factor, int | np.integer) or factor < 1:
        raise ValueError(f"factor must be a positive integer, got {factor!r}")
    x = np.asarray(images)
    if x.ndim < 2:
        raise ValueError(f"images must have at least 2 axes (..., H, W), got shape {x.shape}")
    h, w = x.shape[-2:]
    if h % factor or w % factor:
        raise ValueError(f"image size {h}x{w} is not divisible by factor {factor}")
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float32)
    blocks = x.reshape(*x.shape[:-2], h // factor, factor, w // factor, factor)
    # Accumulate in float64 so uint8 sums and float32 rounding do not bias the mean.
    return blocks.mean(axis=(-3, -1), dtype=np.float64).astype(dtype)


def standardize(X_train: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Standardize features with statistics fitted on the training set only.

    Computes per-feature mean and standard deviation over axis 0 of
    ``X_train`` and applies ``(X - mean) / std`` to ``X_train`` and every array
    in ``others`` (validation, test...). Fitting on train only keeps held-out data
    unseen. A feature (near-)constant on the training set (std <= 1e-8 times its
    scale) is only centred, as scikit-learn's ``StandardScaler`` does: dividing by
    a floored std would blow a held-out value of that feature up to ~1e8 (a border
    pixel that is 0 in every training image but not in one validation image made
    the outer Hessian of PZOBO E5 ~6e11 on the digits stand-in).

    Args:
        X_train: Array ``(n, ...)``, statistics are taken over the first axis.
        *others: Arrays with the same trailing shape as ``X_train``.

    Returns:
        Tuple ``(X_train_std, *others_std)``, always a tuple, even with no
        ``others`` (write ``(X,) = standardize(X)``). Floating inputs keep their
        dtype, integer inputs become float32.

    Raises:
        ValueError: ``X_train`` is empty or trailing shapes differ.
    """
    train = np.asarray(X_train)
    if train.ndim < 1 or train.shape[0] == 0:
        raise ValueError(f"X_train must have at least one row, got shape {train.shape}")
    arrays = [train, *(np.asarray(o) for o in others)]
    for i, a in enumerate(arrays[1:], 1):
        if a.shape[1:] != train.shape[1:]:
            raise ValueError(
                f"others[{i - 1}] has trailing shape {a.shape[1:]}, X_train has {train.shape[1:]}"
            )
    # Statistics in float64: float32 variance of large-mean features loses digits.
    mean = train.mean(axis=0, dtype=np.float64)
    std = train.std(axis=0, dtype=np.float64)
    scale = np.maximum(np.abs(mean), 1.0)
    std = np.where(std > _STD_FLOOR * scale, std, 1.0)  # constant on train: centre only
    out = []
    for a in arrays:
        dtype = a.dtype if np.issubdtype(a.dtype, np.floating) else np.dtype(np.float32)
        out.append(((a - mean) / std).astype(dtype))
    return tuple(out)
