"""Methods that estimate the implicit hypergradient grad F(x) = grad_x f - grad_xy g [grad_yy g]^-1
grad_y f with an approximate inner solution and an adjoint (linear-system) estimate: stocBiO,
AID-CG, AID-FP, TTSA, BSA, SOBA, SABA, and ITD (reverse mode through the inner loop).

The first six are presets of one estimator (``implicit``), each the composition of an adjoint
strategy (``adjoint``: conjugate gradient, fixed point, Neumann series, ...) and a timing
strategy (``timing``: a double loop or a single loop).
"""
