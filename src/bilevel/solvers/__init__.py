"""Solvers: ``bl.solvers.make(name, **hyperparameters)``, ``bl.solvers.names()`` and every
solver class.

The solvers live by method family, one file per registered name (``aid-cg`` in
``hypergradient/aid_cg.py``): ``hypergradient/`` (the implicit-hypergradient estimators:
stocBiO, AID-CG, AID-FP, TTSA, BSA, SOBA, SABA, ITD), ``penalty/`` (F2SA, F3SA),
``zeroth_order/`` (PZOBO, PZOBO-S, HOZOG), ``frank_wolfe/`` (IBCG, SBFW), ``second_order/``
(STABLE) and ``online/`` (F2OBO, F2OBO-SL, AF2OBO, SF2OBO and the online baselines). Importing a
solver's module registers it (``@register("name")``); this package imports them all, so
``make`` knows every name. ``registry.table()`` lists each name with its class, family, paper
and file (``bilevel solvers --long``; ``python -m bilevel.solvers --markdown`` writes
``docs/solvers.md``).
"""

from bilevel.solvers.base import Solver
from bilevel.solvers.frank_wolfe.ibcg import IBCG
from bilevel.solvers.frank_wolfe.sbfw import SBFW
from bilevel.solvers.hypergradient.aid_cg import AIDCG
from bilevel.solvers.hypergradient.aid_fp import AIDFP
from bilevel.solvers.hypergradient.bsa import BSA
from bilevel.solvers.hypergradient.itd import ITD
from bilevel.solvers.hypergradient.saba import SABA
from bilevel.solvers.hypergradient.soba import SOBA
from bilevel.solvers.hypergradient.stocbio import StocBiO
from bilevel.solvers.hypergradient.ttsa import TTSA
from bilevel.solvers.online.af2obo import AF2OBO
from bilevel.solvers.online.aobo import AOBO
from bilevel.solvers.online.f2obo import F2OBO
from bilevel.solvers.online.f2obo_sl import F2OBOSingleLoop
from bilevel.solvers.online.fsobo import FSOBO
from bilevel.solvers.online.oagd import OAGD
from bilevel.solvers.online.obbo import OBBO
from bilevel.solvers.online.sf2obo import SF2OBO
from bilevel.solvers.online.sobbo import SOBBO
from bilevel.solvers.online.sobow import SOBOW
from bilevel.solvers.online.sogd import SOGD
from bilevel.solvers.penalty.f2sa import F2SA
from bilevel.solvers.penalty.f3sa import F3SA
from bilevel.solvers.registry import get, make, names, register
from bilevel.solvers.second_order.stable import STABLE
from bilevel.solvers.zeroth_order.hozog import HOZOG
from bilevel.solvers.zeroth_order.pzobo import PZOBO
from bilevel.solvers.zeroth_order.pzobo_s import PZOBOS

__all__ = [
    "Solver",
    "make",
    "names",
    "get",
    "register",
    # hypergradient
    "StocBiO",
    "AIDCG",
    "AIDFP",
    "TTSA",
    "BSA",
    "SOBA",
    "SABA",
    "ITD",
    # penalty
    "F2SA",
    "F3SA",
    # zeroth order
    "PZOBO",
    "PZOBOS",
    "HOZOG",
    # Frank-Wolfe
    "IBCG",
    "SBFW",
    # second order
    "STABLE",
    # online
    "F2OBO",
    "F2OBOSingleLoop",
    "AF2OBO",
    "SF2OBO",
    "OBBO",
    "SOBBO",
    "SOBOW",
    "OAGD",
    "AOBO",
    "FSOBO",
    "SOGD",
]
