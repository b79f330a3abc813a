"""Hessian-free methods with a zeroth-order-like response Jacobian: PZOBO, PZOBO-S (Sow, Ji
& Liang, NeurIPS 2022; ``pzobo`` also holds the two-path machinery they share) and the HOZOG
baseline."""
