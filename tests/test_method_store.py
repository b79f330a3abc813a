"""``MethodStore``: a long reproduction keeps each finished method and a rerun reuses it only
under the same key (setting, hyperparameters, package version)."""

import json

import numpy as np
import pandas as pd

from bilevel.experiments.method_store import MethodStore

SETTING = {"data": "toy", "cfg": {"rounds": 4}, "seeds": 2}
HYPER = {"lr_inner": 0.1, "max_inner_steps": 1000}


def _frame(offset: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame(
        {"method": "AF2OBO", "step": [10, 20], "regret": [0.1 + offset, np.nan], "seed": [0, 1]}
    )


def test_a_saved_method_is_loaded_back_whole(tmp_path):
    store = MethodStore(tmp_path / "methods", SETTING)
    store.save("AF2OBO", HYPER, _frame(), seconds=12.34)
    again = MethodStore(tmp_path / "methods", dict(SETTING))
    loaded = again.load("AF2OBO", dict(HYPER))
    pd.testing.assert_frame_equal(loaded, _frame())
    entry = json.loads((tmp_path / "methods" / "index.json").read_text())["AF2OBO"]
    assert entry["seconds"] == 12.3 and entry["device"].startswith("cpu")
    (note,) = again.notes()
    assert "AF2OBO (cpu" in note and "12 s" in note


def test_another_key_plays_the_method_anew(tmp_path):
    store = MethodStore(tmp_path / "methods", SETTING)
    store.save("AF2OBO", HYPER, _frame(), seconds=1.0)
    assert store.load("AF2OBO", HYPER | {"max_inner_steps": 20}) is None  # hyperparameter
    other = MethodStore(tmp_path / "methods", SETTING | {"seeds": 5})
    assert other.load("AF2OBO", HYPER) is None  # setting
    assert store.load("F2OBO", HYPER) is None  # never saved
    assert store.notes() == []  # nothing was loaded


def test_a_second_method_keeps_the_first_in_the_index(tmp_path):
    store = MethodStore(tmp_path / "methods", SETTING)
    store.save("AF2OBO", HYPER, _frame(), seconds=1.0)
    store.save("F2OBO-SL", HYPER, _frame(1.0), seconds=2.0)
    assert store.load("AF2OBO", HYPER) is not None
    assert store.load("F2OBO-SL", HYPER).regret.iloc[0] == 1.1
    assert not list((tmp_path / "methods").glob(".*partial*"))  # no temporary file left


def test_an_unreadable_index_or_curve_plays_anew(tmp_path):
    store = MethodStore(tmp_path / "methods", SETTING)
    store.save("AF2OBO", HYPER, _frame(), seconds=1.0)
    (tmp_path / "methods" / "AF2OBO.csv").write_text("")  # an empty (cut-off) curve
    assert store.load("AF2OBO", HYPER) is None
    store.save("AF2OBO", HYPER, _frame(), seconds=1.0)
    (tmp_path / "methods" / "index.json").write_text("{not json")
    assert store.load("AF2OBO", HYPER) is None
