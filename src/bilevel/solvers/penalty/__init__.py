"""Fully first-order penalty methods: F2SA and F3SA (Kwon et al., ICML 2023)."""
