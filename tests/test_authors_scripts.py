"""The authors' three public training scripts (RTkenny/RiskPO, a verl fork) reproduced as opt-ins and recipes.

The reference below re-states the rules of their advantage function
(``compute_grpo_bundle_rvar_outcome_advantage_quantile_tracking`` with each script's switches) as explicit loops over
bundle groups, bundles and members, the way their code walks its dictionaries; it shares nothing with
``riskpo_trl.risk`` but the rules. Their epsilons (1e-6 in every denominator) are kept, so the advantages agree to a
relative 1e-4 (about 1e-5 at worst on these batches; the absolute tolerance only absorbs round-off around exact zeros).
The recipes' prompts, graders and loss are checked here too; the graders in tests/test_verl_graders.py, the loss
granularity in tests/test_token_mean_groups.py.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from riskpo_trl import RiskEstimator, RiskPOConfig, group_quantiles, positional_bundles, riskpo_advantages
from riskpo_trl.data import DAPO_INSTRUCTION_PREFIX, DAPO_INSTRUCTION_SUFFIX
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]

EPS = 1e-6
RTOL, ATOL = 1e-4, 1e-12  # relative; the absolute part is round-off of exact zeros in the float reference


@dataclass(frozen=True)
class Script:
    """One public script's advantage switches (names as in the script) and batch layout."""

    name: str
    recipe: str
    quantile_down: float
    quantile_up: float
    use_mixing_risk_measure: bool  # MVaR: w_mix * lower-tail CVaR term
    risk_seeking_upper_tail: bool  # risk-seeking: upper_weight * upper-tail term
    weight: float  # w_mix or upper_weight
    natural_baseline_adv: bool
    credit_assign_mode: str
    rollout_n: int
    bundle_size: int


SCRIPTS = [
    Script(
        "run_qwen2.5_1.5b_MVaR_dapomath.sh",
        "DeepSeek-R1-Distill-Qwen-1.5B/riskpo_authors/config_dapo_math.yaml",
        0.2,
        0.8,
        True,
        False,
        1.5,
        False,
        "sum-mean",
        10,
        5,
    ),
    Script(
        "run_qwen2.5_1.5b_MVaR_math.sh",
        "Qwen2.5-1.5B-Instruct/riskpo_authors/config_math_gsm8k.yaml",
        0.2,
        0.9,
        True,
        False,
        1.5,
        True,
        "std",
        5,
        5,
    ),
    Script(
        "run_qwen2.5_1.5b_risky_MVaR_math.sh",
        "Qwen2.5-1.5B-Instruct/riskpo_authors/config_math_gsm8k_risk_seeking.yaml",
        0.2,
        0.8,
        False,
        True,
        1.5,
        True,
        "std",
        5,
        5,
    ),
]


def linear_quantile(values: list[float], level: float) -> float:
    """torch.quantile's default ('linear') interpolation, written out."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * level
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def reference_advantages(rewards: list[float], script: Script) -> list[float]:
    """The authors' advantage for a batch laid out as TRL lays it out (G consecutive completions per prompt), with
    their pairing: the j-th completion of every prompt of a group of B prompts forms bundle ("paper") j."""
    G, B = script.rollout_n, script.bundle_size
    alpha, beta = script.quantile_down, script.quantile_up
    num_prompts = len(rewards) // G
    advantages = [0.0] * len(rewards)
    for first in range(0, num_prompts, B):
        prompts = list(range(first, min(first + B, num_prompts)))
        prompt_mean, prompt_std = {}, {}
        for p in prompts:
            answers = rewards[p * G : (p + 1) * G]
            prompt_mean[p] = sum(answers) / G
            std = statistics.stdev(answers)
            prompt_std[p] = std if std > 1e-3 else 1.0
        papers = [[p * G + j for p in prompts] for j in range(G)]
        paper_scores = [sum(rewards[i] for i in paper) for paper in papers]
        q_down = linear_quantile(paper_scores, alpha)
        q_up = linear_quantile(paper_scores, beta)
        group_std = statistics.stdev(paper_scores) if len(paper_scores) > 1 else 1.0
        for paper, score in zip(papers, paper_scores):
            advantage = max(score - q_down, 0.0) - max(score - q_up, 0.0)
            if script.natural_baseline_adv:
                advantage += q_down - q_up
            advantage /= beta - alpha + EPS
            if script.use_mixing_risk_measure:
                lower = -max(q_down - score, 0.0) / (alpha + EPS)
                advantage = (script.weight * lower + advantage) / (script.weight + 1)
            elif script.risk_seeking_upper_tail:
                upper = max(score - q_up, 0.0) / (1 - beta + EPS)
                advantage = (script.weight * upper + advantage) / (script.weight + 1)
            advantage /= group_std + EPS
            if script.credit_assign_mode == "std":
                for i in paper:
                    advantages[i] = advantage / (prompt_std[i // G] + EPS)
            elif script.credit_assign_mode == "sum-mean":
                deviations = [rewards[i] - prompt_mean[i // G] for i in paper]
                total = sum(deviations)
                for i, deviation in zip(paper, deviations):
                    advantages[i] = advantage * deviation / total if abs(total) > 1e-6 else advantage / len(paper)
            elif script.credit_assign_mode == "score":
                for i in paper:
                    advantages[i] = (0.5 if rewards[i] > 0 else 1.5) * advantage
            else:
                for i in paper:
                    advantages[i] = advantage
    return advantages


def random_rewards(script: Script, num_groups: int, signed: bool, seed: int) -> torch.Tensor:
    """Binary rewards with per-prompt success rates that include all-fail and all-pass prompts."""
    generator = torch.Generator().manual_seed(seed)
    num_prompts = num_groups * script.bundle_size
    rates = torch.tensor([0.0, 0.2, 0.5, 0.8, 1.0])[torch.randint(0, 5, (num_prompts,), generator=generator)]
    wins = torch.rand(num_prompts, script.rollout_n, generator=generator) < rates.unsqueeze(1)
    rewards = wins.float().reshape(-1)
    return rewards * 2 - 1 if signed else rewards


def our_fields(script: Script) -> dict:
    """The RiskPOConfig fields that carry the script's switches (what the recipes set)."""
    return {
        "risk_alpha": script.quantile_down,
        "risk_beta": script.quantile_up,
        "risk_omega": script.weight,
        "risk_profile": "mvar" if script.use_mixing_risk_measure else "risk_seeking",
        "natural_baseline": script.natural_baseline_adv,
        "credit_assignment": script.credit_assign_mode.replace("-", "_"),
        "advantage_scaling": "authors_code",
        "quantile_source": "group",
        "bundling": "positional",
        "num_generations": script.rollout_n,
        "bundle_size": script.bundle_size,
    }


@pytest.mark.parametrize("signed", [False, True], ids=["0/1", "+1/-1"])
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_riskpo_advantages_reproduce_each_script(script, signed):
    fields = our_fields(script)
    G, B = script.rollout_n, script.bundle_size
    for seed in range(20):
        rewards = random_rewards(script, num_groups=3, signed=signed, seed=seed)
        bundles = positional_bundles(rewards, G, B)
        q = group_quantiles(bundles[0], G, [script.quantile_down, script.quantile_up])
        ours = riskpo_advantages(
            rewards,
            num_generations=G,
            bundle_size=B,
            q_alpha=q[:, 0],
            q_beta=q[:, 1],
            omega=script.weight,
            risk_profile=fields["risk_profile"],
            bundles=bundles,
            advantage_scaling="authors_code",
            levels=(script.quantile_down, script.quantile_up),
            natural_baseline=script.natural_baseline_adv,
            credit_assignment=fields["credit_assignment"],
        ).advantages
        expected = torch.tensor(reference_advantages(rewards.tolist(), script))
        assert torch.allclose(ours, expected, rtol=RTOL, atol=ATOL), (seed, (ours - expected).abs().max())


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_the_estimator_with_the_scripts_fields_reproduces_it(script):
    estimator = RiskEstimator(
        **{k: v for k, v in our_fields(script).items() if not k.startswith("risk_")},
        alpha=script.quantile_down,
        beta=script.quantile_up,
        omega=script.weight,
        risk_profile=our_fields(script)["risk_profile"],
    )
    for seed in range(5):
        rewards = random_rewards(script, num_groups=2, signed=seed % 2 == 1, seed=100 + seed)
        ours = estimator.step(rewards, generator=None, train=True).advantages
        expected = torch.tensor(reference_advantages(rewards.tolist(), script))
        assert torch.allclose(ours, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mode", ["uniform", "score"])
def test_the_other_credit_modes_match_the_rules(mode):
    script = Script("uniform/score", "", 0.2, 0.8, True, False, 1.5, True, mode, 5, 5)
    rewards = random_rewards(script, num_groups=2, signed=False, seed=7)
    bundles = positional_bundles(rewards, 5, 5)
    q = group_quantiles(bundles[0], 5, [0.2, 0.8])
    ours = riskpo_advantages(
        rewards,
        num_generations=5,
        bundle_size=5,
        q_alpha=q[:, 0],
        q_beta=q[:, 1],
        omega=1.5,
        bundles=bundles,
        advantage_scaling="authors_code",
        levels=(0.2, 0.8),
        credit_assignment=mode,
    ).advantages
    assert torch.allclose(ours, torch.tensor(reference_advantages(rewards.tolist(), script)), rtol=RTOL, atol=ATOL)


def test_sum_mean_flips_signs_and_the_dapo_setting_gives_positive_advantages():
    """What the issue reports: without the natural baseline most completions get a positive advantage (none do under
    the paper's formula), and sum-mean credit flips the sign of some completions relative to uniform credit."""
    script = SCRIPTS[0]
    rewards = random_rewards(script, num_groups=4, signed=True, seed=3)
    dapo = torch.tensor(reference_advantages(rewards.tolist(), script))
    uniform = torch.tensor(
        reference_advantages(rewards.tolist(), Script(**{**script.__dict__, "credit_assign_mode": "uniform"}))
    )
    assert (dapo > 0).any() and (torch.sign(dapo) * torch.sign(uniform) < 0).any()


def test_plus_minus_one_rewards_give_the_dapo_script_the_same_advantages_as_one_zero():
    """Their DAPO-Math reward is +1/-1 (verl_math_dapo, the recipe's), math_verify's 1/0: for this script's switches
    the advantage is unchanged, so the recipe's commented math_verify line changes the grader only."""
    script = SCRIPTS[0]
    for seed in range(10):
        zero_one = random_rewards(script, num_groups=2, signed=False, seed=seed)
        assert reference_advantages(zero_one.tolist(), script) == pytest.approx(
            reference_advantages((2 * zero_one - 1).tolist(), script), rel=RTOL, abs=ATOL
        )


# --- the recipes ---------------------------------------------------------------------------------------------------

# Per script: (training processes it was run on, prompts per generation batch here, prompts per optimizer step here,
# the script's optimizer steps in all and between checkpoints: total_training_steps and save_freq, in generation
# batches, x train_batch_size / ppo_mini_batch_size)
LAYOUTS = {
    "run_qwen2.5_1.5b_MVaR_dapomath.sh": (8, 640, 128, 500 * 4, 10 * 4),
    "run_qwen2.5_1.5b_MVaR_math.sh": (4, 1040, 520, 200 * 2, 10 * 2),
    "run_qwen2.5_1.5b_risky_MVaR_math.sh": (4, 1040, 520, 200 * 2, 10 * 2),
}
# What they ran: their data scripts' prompts and verl's graders (DAPO rows: the Answer: line; MATH and GSM8K rows by
# data_source, GSM8K's strict "#### <number>" included)
GRADERS = {
    "run_qwen2.5_1.5b_MVaR_dapomath.sh": "verl_math_dapo",
    "run_qwen2.5_1.5b_MVaR_math.sh": "verl_by_source",
    "run_qwen2.5_1.5b_risky_MVaR_math.sh": "verl_by_source",
}


def parse_recipe(script: Script, *extra: str):
    with warnings.catch_warnings():  # the DAPO recipe's 64-sequence groups tile a step on its 8 processes, not here
        warnings.filterwarnings("ignore", message="An optimizer step holds", category=UserWarning)
        return train.parse_args(["--config", str(ROOT / "recipes" / script.recipe), "--bf16", "false", *extra])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_each_recipe_carries_its_scripts_settings(script):
    script_args, args, model_args = parse_recipe(script)
    assert script_args.trainer == "riskpo" and isinstance(args, RiskPOConfig)
    for name, value in our_fields(script).items():
        assert getattr(args, name) == value, name
    # verl's loss: token-level ratio, token-mean per micro-batch, clip 0.2, dual clip at 3; no KL; verl's temperature
    assert (args.importance_sampling_level, args.loss_type, args.epsilon, args.delta) == ("token", "bnpo", 0.2, 3.0)
    assert (args.beta, args.temperature, args.top_p, args.learning_rate) == (0.0, 1.0, 1.0, 1e-6)
    assert args.lr_scheduler_type == "constant" and args.weight_decay == 0.01
    assert args.vllm_importance_sampling_correction is False  # verl 0.4.1 has no sampler/trainer correction
    processes, prompts, step_prompts, script_steps, script_save_steps = LAYOUTS[script.name]
    per_generation = args.per_device_train_batch_size * processes * args.steps_per_generation
    per_step = args.per_device_train_batch_size * processes * args.gradient_accumulation_steps
    assert per_generation // args.num_generations == prompts and per_step // args.num_generations == step_prompts
    assert args.max_steps == script_steps and args.save_steps == script_save_steps
    dapo = "dapo" in script.name
    assert model_args.model_name_or_path == (
        "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B" if dapo else "Qwen/Qwen2.5-1.5B-Instruct"
    )
    assert script_args.dataset_name == ("dapo_math" if dapo else "math_gsm8k")
    assert script_args.prompt_template == "authors" and script_args.reward_funcs == [GRADERS[script.name]]
    if dapo:  # verl's token mean over 64-sequence micro-batches: 20 of them per optimizer step, as theirs
        assert args.loss_token_mean_sequences == 64 and per_step == 20 * 64
        assert 64 % args.per_device_train_batch_size == 0
    # "what they meant": one commented line switches the grader to math-verify
    text = (ROOT / "recipes" / script.recipe).read_text()
    commented = [line for line in text.splitlines() if line.lstrip("# ").startswith("- math_verify")]
    assert len(commented) == 1 and commented[0].startswith("#")
    switched = yaml.safe_load(
        text.replace(commented[0], commented[0].lstrip("#")).replace(
            f"  - {GRADERS[script.name]}", f"#  - {GRADERS[script.name]}"
        )
    )
    assert switched["reward_funcs"] == ["math_verify"]


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


# Per script: the training set its one CPU step reads (its own schema) and what one of its prompts must end with
def authors_training_rows(script: Script, tmp_path: Path) -> tuple[list[str], str]:
    if "dapo" in script.name:
        rows = [
            {
                "data_source": "math_dapo",
                "ability": "MATH",
                "extra_info": {"index": str(i)},
                "prompt": [
                    {"role": "user", "content": f"{DAPO_INSTRUCTION_PREFIX}What is {i} + 1?{DAPO_INSTRUCTION_SUFFIX}"}
                ],
                "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            }
            for i in range(20)
        ]
        return ["--dataset_name", "dapo_math", "--dataset_files", write_rows(tmp_path / "dapo.jsonl", rows)], (
            DAPO_INSTRUCTION_SUFFIX
        )
    instruction = " Let's think step by step and output the final answer within \\boxed{}."
    if "risky" in script.name:  # MATH rows (graded by the boxed string-equivalence grader)
        rows = [
            {
                "problem": f"What is {i} + 1?",
                "level": "Level 1",
                "type": "Algebra",
                "solution": f"It is $\\boxed{{{i + 1}}}$.",
            }
            for i in range(10)
        ]
        return ["--dataset_name", "math", "--dataset_files", write_rows(tmp_path / "math.jsonl", rows)], instruction
    # GSM8K rows (graded by the strict "#### <number>" grader)
    return ["--dataset_name", "gsm8k", "--dataset_files", str(ROOT / "examples/data/tiny_arithmetic.jsonl")], (
        instruction
    )


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_each_recipe_trains_one_step_on_cpu_with_the_authors_graders(script, tiny_model_dir, tmp_path):
    G, B = script.rollout_n, script.bundle_size
    data, prompt_ending = authors_training_rows(script, tmp_path)
    if "dapo" in script.name:
        # DAPO's prompts are ~250 tokens for the tiny character-level model: 4 completions per prompt, not 10, and
        # micro-batches of 4 (a divisor of the recipe's 64-sequence groups), keep the step short
        G = 4
        batch = [
            "--num_generations",
            str(G),
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            str(B),
            "--steps_per_generation",
            str(B),
        ]
    else:
        batch = [
            "--per_device_train_batch_size",
            str(G),
            "--gradient_accumulation_steps",
            "1",
            "--steps_per_generation",
            str(B),
        ]
    overrides = [
        "--model_name_or_path",
        tiny_model_dir,
        "--dtype",
        "float32",
        "--attn_implementation",
        "eager",
        *data,
        "--max_completion_length",
        "8",
        "--use_vllm",
        "false",
        "--use_cpu",
        "true",
        "--gradient_checkpointing",
        "false",
        *batch,
        "--max_steps",
        "1",
        "--save_strategy",
        "no",
        "--log_completions",
        "false",
        "--output_dir",
        str(tmp_path / "run"),
    ]
    script_args, training_args, model_args = parse_recipe(script, *overrides)
    trainer, checkpoint = train.prepare(script_args, training_args, model_args)
    batches, rewards = [], []
    trainer.add_batch_observer(lambda scored: batches.append(scored.risk))
    trainer.add_batch_observer(lambda scored: rewards.extend(scored.rewards_per_func[:, 0].tolist()))
    train.train_and_save(trainer, script_args, training_args, checkpoint)
    assert trainer.state.global_step == 1
    assert trainer.train_dataset[0]["prompt"][-1]["content"].endswith(prompt_ending)
    grader = GRADERS[script.name]
    assert [f.__name__ for f in trainer.reward_funcs] == [f"{grader}_reward"]
    # the DAPO grader scores +1/-1 (a tiny random model never writes "Answer: <the sum>"), the others 1/0
    assert set(rewards) <= ({-1.0, 1.0} if "dapo" in script.name else {0.0, 1.0}) and len(rewards) > 0
    batch = batches[-1]
    # the authors' positional pairing: completion j of each of the group's B prompts forms bundle j
    assert batch.bundle_ids[: B * G].tolist() == [j for _ in range(B) for j in range(G)]
    assert not torch.isnan(batch.advantages).any()
    assert math.isfinite(next(e["loss"] for e in trainer.state.log_history if "loss" in e))
