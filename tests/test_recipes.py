"""Every recipe parses through the training script's own parser, so none can rot."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml
from accelerate.commands.config.config_args import load_config_from_file

from riskpo_trl import RiskPOConfig
from riskpo_trl.risk.defaults import resolve_advantage_baseline
from riskpo_trl.scripts import train
from riskpo_trl.trainer.config import COMPLETIONS_PRINTED
from riskpo_trl.trainer.registry import get_trainer_classes

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("config_*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "recipes" / "accelerate_configs").glob("*.yaml"))
# riskpo_authors/ mirrors the authors' public scripts, not the paper (tests/test_authors_scripts.py checks those).
PAPER_RECIPES = [p for p in RECIPES if "tiny" not in p.parts and "riskpo_authors" not in p.parts]


# Written for 8 processes (1,280 sequences a step, twenty 64-sequence token-mean groups); parsed here on one, it
# warns that a step of 160 sequences is not whole groups.
AUTHORS_DAPO = ROOT / "recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo_authors/config_dapo_math.yaml"
ONE_PROCESS_WARNING = (
    r"An optimizer step holds 160 sequences \(per_device_train_batch_size=8 x 1 processes .*on 1 "
    r"process\(es\), gradient_accumulation_steps a multiple of 8"
)


def parse(path: Path, *extra: str):
    # The paper recipes leave bf16 to the config: GRPOConfig makes it True, which only a bf16 accelerator accepts.
    argv = ["--config", str(path), "--bf16", "false", *extra]
    if path == AUTHORS_DAPO:
        with pytest.warns(UserWarning, match=ONE_PROCESS_WARNING):
            return train.parse_args(argv)
    return train.parse_args(argv)


def recipe_id(path: Path) -> str:
    return str(path.relative_to(ROOT / "recipes"))


def test_recipes_cover_both_settings_all_methods_and_ablations():
    names = {recipe_id(p) for p in RECIPES}
    for model, task in [("DeepSeek-R1-Distill-Qwen-1.5B", "dapo_math"), ("Qwen2.5-Math-1.5B-Instruct", "math_gsm8k")]:
        for method in ["riskpo", "grpo", "dr_grpo", "dapo", "gmpo"]:
            assert f"{model}/{method}/config_{task}.yaml" in names
    for ablation in ["risk_seeking", "bundle_size", "alpha_beta", "omega"]:
        assert f"Qwen2.5-Math-1.5B-Instruct/riskpo/config_math_gsm8k_{ablation}.yaml" in names
    assert {
        "DeepSeek-R1-Distill-Qwen-1.5B/riskpo_loo/config_dapo_math.yaml",
        "Qwen2.5-Math-1.5B-Instruct/riskpo_loo/config_math_gsm8k.yaml",
        "Qwen2.5-Math-1.5B-Instruct/riskpo_loo/config_math_gsm8k_lora.yaml",  # the default with LoRA
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_recipe_parses_and_sets_vllm_mode(path):
    raw = yaml.safe_load(path.read_text())
    assert "vllm_mode" in raw, "every recipe sets vllm_mode explicitly"
    if raw.get("use_vllm"):
        assert raw["vllm_mode"] == "server"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # e.g. checkpoints that would fall inside a generation batch and not resume exactly
        warnings.filterwarnings("error", message="Checkpoints every", category=UserWarning)
        script_args, training_args, model_args = parse(path)
    # only the authors' DAPO recipe warns about its token-mean groups on one process, and parse() expects that
    assert not [w for w in caught if str(w.message).startswith("An optimizer step holds")]
    # Each recipe is parsed into its own trainer's config class, not a RiskPOConfig copied into another one.
    config_class, _ = get_trainer_classes(script_args.trainer)
    assert type(training_args) is config_class
    assert (script_args.trainer == "riskpo") == isinstance(training_args, RiskPOConfig)
    assert model_args.model_name_or_path == raw["model_name_or_path"]


@pytest.mark.parametrize("path", PAPER_RECIPES, ids=recipe_id)
def test_paper_recipes_use_the_papers_hyperparameters(path):
    _, args, _ = parse(path)
    assert (args.num_generations, args.temperature, args.top_p, args.beta) == (10, 0.8, 1.0, 0.0)
    assert args.max_completion_length == 3072
    assert args.use_vllm and args.vllm_mode == "server"
    # On the 8 training processes the recipes are written for: 480 prompts per generation batch, 4 mini-batches.
    processes = 8
    completions_per_step = args.per_device_train_batch_size * processes * args.gradient_accumulation_steps
    completions_per_generation = args.per_device_train_batch_size * processes * args.steps_per_generation
    assert completions_per_generation // args.num_generations == 480
    assert completions_per_generation // completions_per_step == 4
    # Baselines keep RiskPO's batch (a multiple of its bundle size B=5), so every method sees the same prompts.
    assert (completions_per_generation // args.num_generations) % getattr(args, "bundle_size", 5) == 0


RISKPO_RECIPES = [p for p in RECIPES if yaml.safe_load(p.read_text())["trainer"] == "riskpo"]


@pytest.mark.parametrize("path", RISKPO_RECIPES, ids=recipe_id)
def test_riskpo_recipes_state_their_baseline(path):
    """The paper's and the authors' recipes say they use no baseline, whatever the default; only riskpo_loo/ uses one,
    with every other setting of its paper recipe."""
    raw = yaml.safe_load(path.read_text())
    _, args, _ = parse(path)
    assert raw["advantage_baseline"] == args.advantage_baseline == ("loo" if "riskpo_loo" in path.parts else "none")
    if "riskpo_loo" in path.parts:
        paper = yaml.safe_load((path.parents[1] / "riskpo" / path.name).read_text())
        differs = {key for key in {*raw, *paper} if raw.get(key) != paper.get(key)}
        assert differs == {"advantage_baseline", "output_dir"}


def resolved_baseline(args) -> str:
    return resolve_advantage_baseline(args.advantage_baseline, args.advantage_scaling)


def test_command_line_sets_the_baseline(tmp_path):
    path = ROOT / "recipes/Qwen2.5-Math-1.5B-Instruct/riskpo/config_math_gsm8k.yaml"
    assert parse(path, "--advantage_baseline", "loo")[1].advantage_baseline == "loo"
    # A recipe that does not state it gets the default; with the authors' scaling alone, their "none".
    unstated = write_recipe(tmp_path, drop=("advantage_baseline",))
    assert resolved_baseline(parse(unstated)[1]) == "loo"
    assert parse(unstated, "--advantage_baseline", "none")[1].advantage_baseline == "none"
    authors = yaml.safe_load(
        (ROOT / "recipes/Qwen2.5-1.5B-Instruct/riskpo_authors/config_math_gsm8k.yaml").read_text()
    )
    authors.pop("advantage_baseline")
    (tmp_path / "authors.yaml").write_text(yaml.safe_dump(authors))
    assert resolved_baseline(parse(tmp_path / "authors.yaml")[1]) == "none"
    with pytest.raises(ValueError, match="advantage_baseline='loo' with advantage_scaling='authors_code'"):
        parse(
            ROOT / "recipes/Qwen2.5-1.5B-Instruct/riskpo_authors/config_math_gsm8k.yaml", "--advantage_baseline", "loo"
        )


def test_command_line_overrides_recipe():
    path = ROOT / "recipes/Qwen2.5-Math-1.5B-Instruct/riskpo/config_math_gsm8k.yaml"
    _, args, _ = parse(path, "--bundle_size", "2", "--risk_omega", "0.25")
    assert (args.bundle_size, args.risk_omega) == (2, 0.25)


TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"


def write_recipe(tmp_path: Path, drop: tuple[str, ...] = (), **changes) -> Path:
    recipe = {k: v for k, v in yaml.safe_load(TINY_RECIPE.read_text()).items() if k not in drop}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**recipe, **changes}))
    return path


def test_unknown_recipe_key_is_named(tmp_path):
    with pytest.raises(ValueError, match="risk_omgea"):
        parse(write_recipe(tmp_path, risk_omgea=0.5))


def test_misspelled_field_is_reported_first_with_the_closest_name(tmp_path):
    # bundel_size: 2 leaves bundle_size at its default 5, which RiskPOConfig would reject first (2 prompts per
    # generation batch are not a multiple of 5) if the unknown name were not checked before the config's validation.
    path = write_recipe(tmp_path, drop=("bundle_size",), bundel_size=2)
    with pytest.raises(ValueError, match=r"bundel_size \(did you mean bundle_size\?\)"):
        parse(path)


def test_misspelled_command_line_option_is_named_with_the_closest_name():
    with pytest.raises(ValueError, match=r"--risk_omgea \(did you mean risk_omega\?\)"):
        parse(TINY_RECIPE, "--risk_omgea", "0.5")


def test_risk_field_in_a_baseline_recipe_is_named_as_such(tmp_path):
    with pytest.raises(ValueError, match=r"bundle_size \(a RiskPOConfig field; trainer 'grpo' does not take it\)"):
        parse(write_recipe(tmp_path, trainer="grpo"))


RISK_FIELDS = ("risk_alpha", "risk_beta", "risk_omega", "bundle_size", "advantage_baseline")


@pytest.mark.parametrize("trainer", ["grpo", "gmpo"])
def test_baseline_without_loss_fields_gets_its_own_configs_defaults(tmp_path, trainer):
    """A baseline recipe that does not set the loss/sampling fields runs with its config's defaults, not RiskPO's."""
    loss_fields = (
        "importance_sampling_level",
        "temperature",
        "loss_type",
        "num_generations",
        "per_device_train_batch_size",
    )
    path = write_recipe(tmp_path, drop=(*RISK_FIELDS, *loss_fields, "trainer"), num_generations=4)
    script_args, args, _ = parse(path, "--trainer", trainer)
    config_class, _ = get_trainer_classes(trainer)
    assert script_args.trainer == trainer and type(args) is config_class
    for name in ("importance_sampling_level", "temperature", "loss_type", "per_device_train_batch_size"):
        assert getattr(args, name) == config_class.__dataclass_fields__[name].default, name
    # The test means something: RiskPO's defaults differ on these fields.
    riskpo = RiskPOConfig(num_generations=4, per_device_train_batch_size=8, bundle_size=2)
    assert (riskpo.importance_sampling_level, riskpo.temperature) != (args.importance_sampling_level, args.temperature)


def test_baseline_takes_grpo_options_riskpo_rejects(tmp_path):
    path = write_recipe(tmp_path, drop=RISK_FIELDS, trainer="grpo", multi_objective_aggregation="normalize_then_sum")
    _, args, _ = parse(path)
    assert args.multi_objective_aggregation == "normalize_then_sum"


def test_trainer_on_the_command_line_wins_over_the_recipe(tmp_path):
    _, args, _ = parse(write_recipe(tmp_path, drop=RISK_FIELDS, trainer="riskpo"), "--trainer=grpo")
    assert not isinstance(args, RiskPOConfig)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("reward_funcs", ["math_verify", "no_such_reward"], "no_such_reward"),
        ("dataset_name", "dapo_math_18k", "dapo_math_18k"),
        ("trainer", "ppo", "ppo"),
    ],
)
def test_unknown_names_fail_at_startup(tmp_path, key, value, named):
    recipe = yaml.safe_load((ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml").read_text())
    recipe[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ValueError, match=named):
        parse(path)


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_configs_load(path):
    config = load_config_from_file(str(path))
    assert config.num_processes >= 1
    if "zero" in path.name:
        assert config.deepspeed_config["zero_stage"] == (2 if "zero2" in path.name else 3)
    if "offload" in path.name:
        assert config.deepspeed_config["offload_param_device"] == "cpu"


def test_accelerate_configs_cover_the_documented_setups():
    names = {p.name for p in ACCELERATE_CONFIGS}
    assert {
        "ddp.yaml",
        "zero2.yaml",
        "zero3.yaml",
        "zero3_offload.yaml",
        "zero3_cpu.yaml",
        "cpu_2proc.yaml",
        "cpu_single.yaml",
    } <= names


@pytest.mark.parametrize("path", RECIPES, ids=recipe_id)
def test_a_recipe_that_logs_completions_prints_a_sample_as_the_config_default_does(path):
    """TRL prints the whole generation batch per logging step by default (4,800 completions in the paper's layout)."""
    _, args, _ = parse(path)
    if args.log_completions:
        assert args.num_completions_to_print == COMPLETIONS_PRINTED
    assert RiskPOConfig(output_dir="unused", use_cpu=True).num_completions_to_print == COMPLETIONS_PRINTED


@pytest.mark.parametrize("path", RISKPO_RECIPES, ids=recipe_id)
def test_a_recipe_off_the_documented_baseline_default_says_why_at_its_top(path):
    """docs/training.md says keep the default (loo): a recipe that does not says so in its header, before any setting."""
    _, args, _ = parse(path)
    header = path.read_text().split("\n\n")[0]
    if args.advantage_baseline != "loo":
        assert f"advantage_baseline: {args.advantage_baseline}, not the library default loo:" in header
    else:
        assert "advantage_baseline: loo" in header.replace("\n# ", " ")
