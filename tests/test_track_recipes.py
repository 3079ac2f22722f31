"""The code and multi-modal recipes parse through the training script's own parser into the right data and rewards."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from riskpo_trl import RiskPOConfig
from riskpo_trl.code import CodeReward, SandboxLimits
from riskpo_trl.multimodal import geometry_accuracy_reward
from riskpo_trl.scripts import train
from riskpo_trl.tracks import BENCHMARKS, TRAIN_DATASETS, get_reward_funcs

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
CODE_RECIPES = sorted(RECIPES.glob("*/*/config_archer_code.yaml"))
GEOMETRY_RECIPES = sorted(RECIPES.glob("*/*/config_geometry3k.yaml"))
TRACK_RECIPES = CODE_RECIPES + GEOMETRY_RECIPES


def parse(path: Path, *extra: str):
    # The paper recipes leave bf16 to the config: GRPOConfig makes it True, which only a bf16 accelerator accepts.
    return train.parse_args(["--config", str(path), "--bf16", "false", *extra])


def recipe_id(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.parent.name}/{path.stem}"


def write_recipe(tmp_path: Path, source: Path, **changes) -> Path:
    recipe = {**yaml.safe_load(source.read_text()), **changes}
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_every_track_has_riskpo_and_baseline_recipes():
    names = {recipe_id(p) for p in TRACK_RECIPES}
    for method in ("riskpo", "grpo", "dapo"):
        assert f"DeepSeek-R1-Distill-Qwen-1.5B/{method}/config_archer_code" in names
    for method in ("riskpo", "grpo"):
        assert f"Qwen2.5-VL-3B-Instruct/{method}/config_geometry3k" in names


@pytest.mark.parametrize("path", CODE_RECIPES, ids=recipe_id)
def test_code_recipe_selects_archer_livecodebench_and_the_sandboxed_reward(path):
    raw = yaml.safe_load(path.read_text())
    script_args, training_args, model_args = parse(path)
    assert isinstance(training_args, RiskPOConfig) == (script_args.trainer == "riskpo")
    assert model_args.model_name_or_path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert TRAIN_DATASETS[script_args.dataset_name].hub_id == "wizardII/ArcherCodeR-Dataset"
    assert script_args.eval_benchmark == "livecodebench_v5" and script_args.eval_benchmark in BENCHMARKS
    [reward] = script_args.reward_functions  # what the trainer gets
    assert isinstance(reward, CodeReward)
    sandbox_settings = dict(raw["code_sandbox"])
    assert reward.sandbox.max_workers == sandbox_settings.pop("max_workers")
    assert reward.sandbox.limits == SandboxLimits(**sandbox_settings)


@pytest.mark.parametrize("path", GEOMETRY_RECIPES, ids=recipe_id)
def test_geometry_recipe_selects_geometry3k_and_its_reward(path):
    script_args, _, model_args = parse(path)
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert TRAIN_DATASETS[script_args.dataset_name].hub_id == "hiyouga/geometry3k"
    assert script_args.eval_benchmark == "geometry3k_test" and script_args.eval_benchmark in BENCHMARKS
    assert get_reward_funcs(script_args.reward_funcs, script_args.reward_settings) == [geometry_accuracy_reward]


@pytest.mark.parametrize("path", TRACK_RECIPES, ids=recipe_id)
def test_track_recipe_uses_the_papers_riskpo_settings(path):
    script_args, args, _ = parse(path)
    assert (args.num_generations, args.temperature, args.beta) == (10, 0.8, 0.0)
    if script_args.trainer == "riskpo":
        assert (args.risk_alpha, args.risk_beta, args.risk_omega, args.bundle_size) == (0.2, 0.8, 0.5, 5)


@pytest.mark.parametrize("source", [CODE_RECIPES[0], GEOMETRY_RECIPES[0]], ids=recipe_id)
def test_unknown_top_level_key_fails(tmp_path, source):
    with pytest.raises(ValueError, match="eval_dataset_name"):
        parse(write_recipe(tmp_path, source, eval_dataset_name="livecodebench_v5"))


def test_unknown_code_sandbox_key_fails_naming_it(tmp_path):
    source = RECIPES / "DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_archer_code.yaml"
    path = write_recipe(tmp_path, source, code_sandbox={"max_workers": 2, "memroy_mb": 512})
    with pytest.raises(ValueError, match="memroy_mb"):
        parse(path)


def test_invalid_sandbox_limit_fails_at_startup(tmp_path):
    source = RECIPES / "DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_archer_code.yaml"
    with pytest.raises(ValueError, match="test_timeout_s"):
        parse(write_recipe(tmp_path, source, code_sandbox={"test_timeout_s": 0}))


def test_code_sandbox_from_the_command_line_is_json():
    source = RECIPES / "DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_archer_code.yaml"
    script_args, _, _ = parse(source, "--code_sandbox", '{"max_workers": 3, "memory_mb": 512}')
    [reward] = get_reward_funcs(script_args.reward_funcs, script_args.reward_settings)
    assert reward.sandbox.max_workers == 3 and reward.sandbox.limits.memory_mb == 512


@pytest.mark.parametrize(("key", "value"), [("dataset_name", "archer_cdoe"), ("eval_benchmark", "livecodebench_v6")])
def test_unknown_track_names_fail(tmp_path, key, value):
    source = RECIPES / "DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_archer_code.yaml"
    with pytest.raises(ValueError, match=value):
        parse(write_recipe(tmp_path, source, **{key: value}))
