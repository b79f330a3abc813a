"""Methods with explicit (projected) Hessian estimates: STABLE (Chen, Sun, Xiao & Yin, AISTATS
2022), with its eigenvalue floor (``eigen_floor``)."""
