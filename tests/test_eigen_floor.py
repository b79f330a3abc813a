"""STABLE's Punder with a Cholesky certificate (``bilevel.solvers.second_order.eigen_floor``).

The projection onto {M >= floor I} is checked against its definition by eigendecomposition
(numpy's ``eigh``) on both sides of the certificate (floor below lambda_min: no eigenvalue
moves; above: the low eigenvalues are raised), and per member of a batch whose members fall on
different sides (the ``custom_vmap`` runs ONE branch for the whole batch and must still give
each member its own projection). Float64; the tolerances are eigendecomposition round-off of
50 x 50 matrices with eigenvalues below 5 (1e-12).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilevel.solvers.second_order.eigen_floor import (
    floor_and_factor,
    floor_eigenvalues,
    smallest_eigenvalue,
    solve_with_factor,
)


def reference(matrix, floor):
    lam, q = np.linalg.eigh(0.5 * (matrix + matrix.T))
    return (q * np.maximum(lam, floor)) @ q.T


@pytest.fixture
def spd():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((50, 50))
    return a @ a.T / 50 + 0.5 * np.eye(50)  # lambda_min ~ 0.5, lambda_max ~ 4


def test_smallest_eigenvalue_matches_eigh(spd):
    """lambda_min to round-off (float64), on the 50 x 50 SPD matrix, a 1 x 1 and an indefinite
    2 x 2 (a bisection that returned another eigenvalue, e.g. select index n - 1, fails)."""
    lam = np.linalg.eigvalsh(spd)
    np.testing.assert_allclose(smallest_eigenvalue(jnp.asarray(spd)), lam[0], rtol=1e-12)
    for m in (np.array([[3.0]]), np.array([[2.0, 1.0], [1.0, -1.0]])):
        expected = np.linalg.eigvalsh(m)[0]
        np.testing.assert_allclose(smallest_eigenvalue(jnp.asarray(m)), expected, rtol=1e-12)
    assert float(jax.jit(smallest_eigenvalue)(jnp.asarray(spd))) == pytest.approx(lam[0], 1e-12)


@pytest.mark.parametrize("offset", [-0.3, 0.05, 1.0])  # floor below / just above / far above
def test_projection_and_factor_match_the_eigendecomposition(spd, offset):
    floor = np.linalg.eigvalsh(spd)[0] + offset
    projected, factor = jax.jit(floor_and_factor)(jnp.asarray(spd), jnp.asarray(floor))
    expected = reference(spd, floor)
    np.testing.assert_allclose(projected, expected, atol=1e-12)
    np.testing.assert_allclose(factor @ factor.T, expected, atol=1e-12)
    assert np.linalg.eigvalsh(np.asarray(projected))[0] >= min(floor, 0.5) * (1 - 1e-12)
    rhs = np.arange(50.0)
    np.testing.assert_allclose(
        solve_with_factor(factor, jnp.asarray(rhs)), np.linalg.solve(expected, rhs), rtol=1e-10
    )
    if offset < 0:  # certified: the matrix is returned as it is, no eigendecomposition
        assert np.array_equal(np.asarray(projected), spd)


def test_a_batch_with_both_branches_gives_each_member_its_projection(spd):
    lam_min = np.linalg.eigvalsh(spd)[0]
    floors = np.array([lam_min - 0.3, lam_min + 0.2, lam_min - 0.1])
    mats = np.stack([spd, spd, 2 * spd])
    projected, factor = jax.jit(jax.vmap(floor_and_factor))(jnp.asarray(mats), floors)
    for i in range(3):
        np.testing.assert_allclose(projected[i], reference(mats[i], floors[i]), atol=1e-12)
        np.testing.assert_allclose(factor[i] @ factor[i].T, projected[i], atol=1e-12)
    # all certified: every member comes back unchanged; nested vmap and an unbatched floor
    nested = jax.vmap(jax.vmap(floor_and_factor, in_axes=(0, None)), in_axes=(0, None))
    out, _ = jax.jit(nested)(jnp.asarray(np.stack([mats, mats])), lam_min - 0.4)
    assert np.array_equal(np.asarray(out[1]), mats)
    out, _ = jax.jit(nested)(jnp.asarray(np.stack([mats, mats])), lam_min + 0.2)
    np.testing.assert_allclose(out[1, 2], reference(mats[2], lam_min + 0.2), atol=1e-12)


def test_floor_eigenvalues_takes_batches(spd):
    mats = np.stack([spd, 3 * spd])
    projected, lam, _ = floor_eigenvalues(jnp.asarray(mats), jnp.asarray([0.7, 0.1]))
    np.testing.assert_allclose(projected[0], reference(spd, 0.7), atol=1e-12)
    np.testing.assert_allclose(projected[1], reference(3 * spd, 0.1), atol=1e-12)
    assert float(lam[0, 0]) == 0.7
