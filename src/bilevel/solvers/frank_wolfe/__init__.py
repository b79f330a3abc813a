"""Projection-free methods for a constrained upper level: IBCG (Abolfazli et al.) and the
SBFW baseline, with the Frank-Wolfe step and LMO helpers they share (``base``)."""
