"""The test tiers (conftest.py marks every test unit, op, model or server: `pytest -m unit`):
the model tier lists exactly the top-level modules that load a model."""

import re

from conftest import MODEL_MODULES, TESTS, tier

# opening a model in the library, or running a CLI command that loads one
LOADS_A_MODEL = re.compile(r"\bModel\(|\bEngine\(|\bopen_engine\(|\btiny_model\(|\bvkrt\.load\(|\bsmollm2_path\("
                           r"|invoke\(cli, \[\"(run|bench|perplexity|serve)\"")


def test_model_modules_are_the_ones_that_load_a_model():
    modules = {p.stem: p.read_text() for p in TESTS.glob("test_*.py") if p.stem != "test_tiers"}
    assert MODEL_MODULES <= modules.keys(), f"listed but missing: {sorted(MODEL_MODULES - modules.keys())}"
    loading = {name for name, text in modules.items() if LOADS_A_MODEL.search(text)}
    assert loading == MODEL_MODULES, (f"load a model but are not in MODEL_MODULES: {sorted(loading - MODEL_MODULES)}; "
                                      f"listed but load none: {sorted(MODEL_MODULES - loading)}")


def test_tier_of_each_folder():
    assert tier(TESTS / "ops" / "test_rope.py") == "op"
    assert tier(TESTS / "server" / "test_server_api.py") == "server"
    assert tier(TESTS / "cpu" / "test_expert_ffn.py") == "op"
    assert tier(TESTS / "test_engine_replay.py") == "model"
    assert tier(TESTS / "test_settings.py") == "unit"
