"""Down-sampling and standardization."""

from __future__ import annotations

import numpy as np
import pytest

from bilevel.data import downsample_images, standardize


def test_downsample_28_to_7_is_block_mean():
    rng = np.random.default_rng(0)
    images = rng.random((3, 28, 28)).astype(np.float32)
    out = downsample_images(images, 4)
    assert out.shape == (3, 7, 7) and out.dtype == np.float32
    np.testing.assert_allclose(out[1, 2, 5], images[1, 8:12, 20:24].mean(), rtol=1e-6)
    np.testing.assert_allclose(out.mean(), images.mean(), rtol=1e-5)


def test_downsample_integer_input_and_errors():
    images = np.arange(16, dtype=np.uint8).reshape(1, 4, 4)
    out = downsample_images(images, 2)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[[2.5, 4.5], [10.5, 12.5]]])
    with pytest.raises(ValueError, match="not divisible"):
        downsample_images(images, 3)
    with pytest.raises(ValueError, match="positive integer"):
        downsample_images(images, 0)


def test_standardize_fits_on_train_only():
    rng = np.random.default_rng(1)
    train = rng.normal(5.0, 2.0, size=(200, 3)).astype(np.float32)
    train[:, 2] = 7.0  # constant feature
    test = rng.normal(5.0, 2.0, size=(50, 3)).astype(np.float32)
    tr, te = standardize(train, test)
    assert tr.dtype == np.float32 and te.dtype == np.float32
    np.testing.assert_allclose(tr[:, :2].mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(tr[:, :2].std(axis=0), 1.0, rtol=1e-5)
    assert np.all(tr[:, 2] == 0.0)  # constant on train: centred, no nan
    # ... and only centred on held-out data: a floored std (1e-8) made these ~1e8
    np.testing.assert_allclose(te[:, 2], test[:, 2] - 7.0, rtol=1e-6)
    mean, std = train.mean(axis=0, dtype=np.float64), train.std(axis=0, dtype=np.float64)
    np.testing.assert_allclose(te[:, :2], (test[:, :2] - mean[:2]) / std[:2], rtol=1e-5)
    (only,) = standardize(train)
    np.testing.assert_array_equal(only, tr)
    with pytest.raises(ValueError, match="trailing shape"):
        standardize(train, test[:, :2])
