"""Few-shot meta-learning as bilevel optimization (PZOBO, Sow, Ji, Liang, NeurIPS 2022, Sec. 4.3).

The backbone (a convolutional feature extractor) is the outer variable x; one linear head per
task is the inner variable, fitted on the task's support set under a strongly convex ridge
regulariser (paper eq. 9). The package holds the pieces of that setting:

* :mod:`~bilevel.meta.heads`: linear heads, their losses and the inner head solver;
* :mod:`~bilevel.meta.base`: the meta-learner contract every method follows;
* episodes, backbones, learners and the meta-training loop (see their modules).

Spec: ``shared/specs/pzobo.md`` sections 3.3-3.5 and E4.
"""
