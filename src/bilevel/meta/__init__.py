"""Few-shot meta-learning as bilevel optimization (PZOBO, Sow, Ji, Liang, NeurIPS 2022, Sec. 4.3).

The backbone (a convolutional feature extractor) is the outer variable x; one linear head per
task is the inner variable, fitted on the task's support set under a strongly convex ridge
regulariser (paper eq. 9). The package holds the pieces of that setting:

* :mod:`~bilevel.meta.heads`: linear heads, their losses and the inner head solver;
* :mod:`~bilevel.meta.base`: the meta-learner contract every method follows;
* :mod:`~bilevel.meta.episodes`: N-way K-shot episode sampling over class-disjoint splits;
  :mod:`~bilevel.meta.datasets`: miniImageNet or the Fashion-MNIST / digits stand-ins;
* :mod:`~bilevel.meta.backbones`: CNN4 and ResNet-12 (equinox, batch-statistics BatchNorm);
* learners, made by name with :func:`make` ("pzobo", "maml", "fomaml", "anil", "protonet");
* :func:`meta_train`: meta-training timed apart from compilation and meta-test evaluation.

Reference: Sow, Ji, Liang, "On the Convergence Theory for Hessian-Free Bilevel Algorithms",
NeurIPS 2022, Sec. 4.3 (Fig. 4, Table 1) and Appendix B.4 (eq. (9), the settings).
"""

from bilevel.meta.backbones import CNN4, ResNet12
from bilevel.meta.datasets import FewShotData, few_shot_data
from bilevel.meta.episodes import Episodes, EpisodeSampler, FewShotSplit
from bilevel.meta.registry import make, names
from bilevel.meta.train import MetaTrace, mean_ci95, meta_train

__all__ = [
    "CNN4",
    "ResNet12",
    "FewShotData",
    "few_shot_data",
    "Episodes",
    "EpisodeSampler",
    "FewShotSplit",
    "make",
    "names",
    "meta_train",
    "MetaTrace",
    "mean_ci95",
]
