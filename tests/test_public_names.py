"""The lazily loaded subpackages of ``import bilevel as bl`` and what they re-export."""

import subprocess
import sys

import bilevel as bl


def test_meta_and_data_load_on_first_use():
    """``bl.meta`` and ``bl.data`` work without importing them first (a fresh interpreter:
    in this one another test may already have imported them)."""
    code = (
        "import sys, bilevel as bl\n"
        "assert 'bilevel.meta' not in sys.modules and 'bilevel.data' not in sys.modules\n"
        "print(bl.data.load_sklearn.__name__, bl.meta.make.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["load_sklearn", "make"]


def test_meta_reexports_its_backbones_and_data():
    from bilevel.meta import backbones, datasets

    assert bl.meta.CNN4 is backbones.CNN4 and bl.meta.ResNet12 is backbones.ResNet12
    assert bl.meta.few_shot_data is datasets.few_shot_data
    assert bl.meta.FewShotData is datasets.FewShotData
    assert {"CNN4", "ResNet12", "few_shot_data", "FewShotData"} <= set(bl.meta.__all__)
    assert "data" in bl.__all__ and "meta" in bl.__all__
