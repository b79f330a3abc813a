"""Bad input to BilevelProblem, make and solve fails early with a message naming the problem."""

import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl


def f(x, y, batch):
    return jnp.sum((y - 1.0) ** 2) + jnp.sum(x**2)


def g(x, y, batch):
    target = x[:3] if batch is None else x[:3] + jnp.mean(batch["a"], axis=0)
    return 0.5 * jnp.sum((y - target) ** 2)


X0, Y0 = jnp.zeros(4), jnp.zeros(3)


def test_valid_problem_builds():
    p = bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, inner_data={"a": np.ones((10, 3))})
    assert p.n_inner == 10 and p.n_outer is None and p.stochastic


def test_x0_that_does_not_fit_f_is_named():
    with pytest.raises(ValueError, match=r"inner.*could not be evaluated.*x0 shapes"):
        bl.BilevelProblem(outer=f, inner=g, x0=jnp.zeros(2), y0=Y0)


def test_y0_shape_mismatch():
    def g_fixed(x, y, batch):
        return 0.5 * jnp.sum((y - jnp.ones(3)) ** 2)

    with pytest.raises(ValueError, match=r"could not be evaluated"):
        bl.BilevelProblem(outer=f, inner=g_fixed, x0=X0, y0=jnp.zeros(5))


def test_non_scalar_outer():
    with pytest.raises(ValueError, match=r"outer=.*must return a scalar.*\(3,\)"):
        bl.BilevelProblem(outer=lambda x, y, b: y, inner=g, x0=X0, y0=Y0)


def test_not_callable():
    with pytest.raises(TypeError, match=r"inner=.*must be a function"):
        bl.BilevelProblem(outer=f, inner=3.0, x0=X0, y0=Y0)


def test_data_leaves_disagree_on_sample_count():
    with pytest.raises(ValueError, match=r"inner_data.*disagree.*\['a'\]: 10.*\['b'\]: 7"):
        bl.BilevelProblem(
            outer=f, inner=g, x0=X0, y0=Y0, inner_data={"a": np.ones((10, 3)), "b": np.ones((7,))}
        )


def test_nonfinite_data():
    data = {"a": np.ones((10, 3))}
    data["a"][4, 1] = np.nan
    with pytest.raises(ValueError, match=r"inner_data.*1 non-finite.*\['a'\]") as info:
        bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, inner_data=data)
    assert str(info.value) == (  # the first offending row, with its index and value
        "BilevelProblem(inner_data=...) has 1 non-finite value(s) (NaN or inf) in leaf ['a'], "
        "the first in row 4 (index (4, 1), value nan); every entry must be finite."
    )
    data["a"][2, 0] = -np.inf
    with pytest.raises(
        ValueError, match=r"has 2 non-finite .* the first in row 2 \(index \(2, 0\), "
    ):
        bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, inner_data=data)


def test_data_whose_squares_overflow_is_refused_like_non_finite():
    """A finite 3e38 in float32 data squares to inf: refused at construction (it passed, and
    the run failed later in the automatic step-size probe with an unrelated LinAlgError)."""
    data = {"a": np.ones((10, 3), np.float32)}
    data["a"][7, 2] = 3e38
    with pytest.raises(ValueError) as info:
        bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, outer_data=data)
    assert str(info.value) == (
        "BilevelProblem(outer_data=...) has 1 value(s) too large for float32 (|v| > 1.84e+19: "
        "the square overflows) in leaf ['a'], the first in row 7 (index (7, 2), value 3e+38); "
        "every entry and its square must be finite: rescale them."
    )
    data["a"][7, 2] = 1.8e19  # its square, 3.24e38, is finite in float32
    bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, outer_data=data)
    wide = {"a": np.full((10, 3), 3e38)}  # float64: squares to 9e76, fine
    bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, outer_data=wide)
    with pytest.raises(ValueError, match=r"x0=.*too large for float64 .* at index \(1,\)"):
        bl.BilevelProblem(outer=f, inner=g, x0=X0.at[1].set(1e200), y0=Y0)


def test_problem_builders_name_the_first_bad_row():
    from bilevel.problems import models

    X = np.ones((6, 2))
    X[3, 1] = 1e200
    with pytest.raises(ValueError) as info:
        models.check_features(X, "X_train", "l2_hpo")
    assert str(info.value).startswith(
        "l2_hpo(X_train=...) has 1 value(s) too large for float64 (|v| > 1.34e+154: the square "
        "overflows), the first in row 3 (index (3, 1), value 1e+200)"
    )


@pytest.mark.parametrize("arg", ["x0", "y0"])
def test_nonfinite_start(arg):
    bad = {"x0": X0.at[1].set(jnp.inf), "y0": Y0.at[0].set(jnp.nan)}[arg]
    kwargs = {"x0": X0, "y0": Y0, arg: bad}
    with pytest.raises(ValueError, match=rf"{arg}=.*non-finite"):
        bl.BilevelProblem(outer=f, inner=g, **kwargs)


def test_scalar_data_leaf():
    with pytest.raises(ValueError, match="leading sample axis"):
        bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, inner_data={"a": np.float64(1.0)})


def test_batch_size_larger_than_data():
    p = bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, inner_data={"a": np.ones((10, 3))})
    solver = bl.solvers.make("f2sa", batch_size=11)
    with pytest.raises(ValueError, match=r"batch_size=11 is larger than the inner data \(10"):
        bl.solve(p, solver, steps=5, progress=False)


def test_unknown_solver_name():
    with pytest.raises(ValueError, match=r"unknown solver 'f2sb'.*Did you mean 'f2sa'"):
        bl.solvers.make("f2sb")


def test_unknown_hyperparameter_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"no hyperparameter\(s\) 'lr_outter'.*lr_outer, lr_inner"):
        bl.solvers.make("f2sa", lr_outter=0.1)


@pytest.mark.parametrize("name", ["f2sa", "stocbio"])
@pytest.mark.parametrize("value", [0.0, -0.1, float("nan")])
def test_nonpositive_step_size(name, value):
    with pytest.raises(ValueError, match=r"lr_outer=.*positive finite step size"):
        bl.solvers.make(name, lr_outer=value)


def test_bad_batch_size_and_inner_steps():
    with pytest.raises(ValueError, match=r"batch_size=.*positive int"):
        bl.solvers.make("f2sa", batch_size=0)
    with pytest.raises(ValueError, match=r"inner_steps=.*positive int"):
        bl.solvers.make("stocbio", inner_steps=2.5)


def test_x0_outside_x_set_is_projected_with_a_warning():
    with pytest.warns(UserWarning, match="x0 lies outside x_set=L2Ball"):
        p = bl.BilevelProblem(
            outer=f, inner=g, x0=jnp.full(4, 3.0), y0=Y0, x_set=bl.sets.L2Ball(1.0)
        )
    assert float(jnp.linalg.norm(p.x0)) == pytest.approx(1.0)


def test_bad_x_set_type():
    with pytest.raises(TypeError, match="x_set=.*bl.sets"):
        bl.BilevelProblem(outer=f, inner=g, x0=X0, y0=Y0, x_set=(0, 1))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"steps": 0}, r"steps=.*positive int"),
        ({"steps": 5, "seeds": []}, r"seeds=.*empty"),
        ({"steps": 5, "seeds": [1, 1]}, r"repeated seeds"),
        ({"steps": 5, "eval_every": 0}, r"eval_every=.*positive"),
        ({"steps": 5, "on_divergence": "ignore"}, r"on_divergence"),
    ],
)
def test_solve_arguments(kwargs, match):
    p = bl.problems.quadratic(dx=2, dy=3)
    with pytest.raises(ValueError, match=match):
        bl.solve(p, bl.solvers.make("f2sa"), progress=False, **kwargs)


def test_solve_type_errors():
    p = bl.problems.quadratic(dx=2, dy=3)
    with pytest.raises(TypeError, match="solve\\(solver=...\\)"):
        bl.solve(p, "f2sa", steps=3)
    with pytest.raises(TypeError, match="solve\\(problem=...\\)"):
        bl.solve(None, bl.solvers.make("f2sa"), steps=3)


def test_solver_without_x_set_support_refuses_a_constrained_problem():
    import dataclasses
    from typing import ClassVar

    from bilevel.solvers.hypergradient.stocbio import StocBiO

    @dataclasses.dataclass(frozen=True)
    class Unconstrained(StocBiO):  # a solver that cannot honour x_set
        supports_x_set: ClassVar[bool] = False
        name: ClassVar[str] = "unconstrained-test"

    p = bl.problems.quadratic(dx=2, dy=3).replace(x_set=bl.sets.L2Ball(10.0))
    with pytest.raises(ValueError, match=r"'unconstrained-test' does not support a constrained"):
        bl.solve(p, Unconstrained(lr_outer=0.1), steps=2, progress=False)
