"""Hessian-free methods with a zeroth-order-like response Jacobian: PZOBO, PZOBO-S (Sow, Ji
& Liang, 2022) and the HOZOG baseline."""
