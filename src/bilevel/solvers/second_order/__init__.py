"""Methods with explicit (projected) Hessian estimates: STABLE (Chen, Xu & Zhang, 2022)."""
