"""The model card of a run says what the run was: its name, its base model, its data, its rewards and its risk
settings, with a quick start that runs as written; a run that took no step gets none."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config

from riskpo_trl import RiskPOConfig, RiskPOTrainer, job
from riskpo_trl.job.model_card import build_model_card, hub_id_or_none
from riskpo_trl.rewards import boxed_format_reward, math_verify_reward


def make_trainer(
    model_dir, output_dir, steps: int = 3, reward_funcs=contains_digit_reward, peft_config=None, **overrides
):
    """A trainer as after ``steps`` optimizer steps (the card's contents do not depend on the weights)."""
    settings = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=4,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        bundle_size=2,
    )
    args = RiskPOConfig(**{**settings, **overrides})
    trainer = job.build(
        RiskPOTrainer,
        model_dir,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=make_prompt_dataset(),
        peft_config=peft_config,
    )
    trainer.state.global_step = steps
    return trainer


def quick_start_code(card: str) -> str:
    return re.search(r"## Quick start\n\n```python\n(.*?)```", card, re.S).group(1)


def header_and_body(card: str) -> tuple[str, str]:
    _, header, body = card.split("---\n", 2)
    return header, body


def test_local_run_card_names_the_output_dir_and_no_hub_ids(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        tiny_model_dir, tmp_path / "tiny-riskpo-run", risk_omega=1.0, bundle_size=4, advantage_baseline="none"
    )
    trainer.create_model_card(dataset_files=["data/train/tiny_arithmetic.jsonl"])
    card = (tmp_path / "tiny-riskpo-run" / "README.md").read_text()
    header, body = header_and_body(card)
    assert "None" not in card
    assert "# Model Card for tiny-riskpo-run" in body
    assert "base_model" not in header and "datasets" not in header  # a local model and a local file
    assert "huggingface.co/datasets" not in body and "`tiny_arithmetic.jsonl`" in body
    assert f'model="{tmp_path / "tiny-riskpo-run"}"' in body
    # The risk settings, with RiskPOConfig's (the paper's) defaults beside them.
    assert "| Lower quantile level alpha | `risk_alpha=0.2` | `0.2` |" in body
    assert "| Mixing weight omega >= 0 of MVaR | `risk_omega=1.0` | `0.5` |" in body
    assert "| Prompts per bundle B | `bundle_size=4` | `5` |" in body
    assert "`risk_beta=0.8`" in body and "`quantile_source=tracked`" in body
    assert "| Advantage baseline | `advantage_baseline=none` | `loo` |" in body
    for name in ("natural_baseline", "credit_assignment", "bundling", "advantage_scaling", "advantage_baseline"):
        assert f"`{name}={getattr(trainer.args, name)}`" in body
    assert "2510.00911" in body and "ren2025riskpo" in body
    assert "- riskpo" in header and "- trl" in header


def test_the_method_sentence_names_a_baseline_that_is_not_the_papers(tiny_model_dir, tmp_path):
    _, loo = header_and_body(str(build_model_card(make_trainer(tiny_model_dir, tmp_path / "loo"))))
    assert re.search(
        r"This model was trained with RiskPO, a method introduced in \[.*?\]\(.*?2510\.00911\), with a "
        r"leave-one-out baseline \(`advantage_baseline=\"loo\"`\), which is not the paper's estimator, "
        r"for 3 optimizer steps\.",
        loo,
    )
    _, paper = header_and_body(
        str(build_model_card(make_trainer(tiny_model_dir, tmp_path / "paper", advantage_baseline="none")))
    )
    assert re.search(
        r"This model was trained with RiskPO, a method introduced in \[.*?\]\(.*?\), for 3 optimizer "
        r"steps\.",
        paper,
    )
    assert "baseline (`advantage_baseline" not in paper


def test_hub_run_card_names_the_hub_repo_base_model_and_datasets(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path / "out", hub_model_id="someone/tiny-riskpo-gsm8k")
    # A model loaded from the Hub records its id; the tiny model here is local, so set what loading would.
    trainer.model.config.name_or_path = "Qwen/Qwen2.5-Math-1.5B-Instruct"
    card = str(build_model_card(trainer, datasets=["openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval"]))
    header, body = header_and_body(card)
    assert "# Model Card for tiny-riskpo-gsm8k" in body
    assert "base_model: Qwen/Qwen2.5-Math-1.5B-Instruct" in header
    assert "- openai/gsm8k" in header and "- DigitalLearningGmbH/MATH-lighteval" in header
    assert "(https://huggingface.co/Qwen/Qwen2.5-Math-1.5B-Instruct)" in body
    assert "(https://huggingface.co/datasets/openai/gsm8k)" in body
    assert 'model="someone/tiny-riskpo-gsm8k"' in body


def test_an_adapter_on_a_hub_model_names_it_as_its_base_in_peft_metadata(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    trainer = make_trainer(
        tiny_model_dir,
        tmp_path / "out",
        peft_config=LoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    # An adapter trained on a Hub model records its id as the base (what PEFT writes into adapter_config.json).
    trainer.model.peft_config["default"].base_model_name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
    header, body = header_and_body(str(build_model_card(trainer)))
    assert "library_name: peft" in header and "base_model: Qwen/Qwen2.5-0.5B-Instruct" in header
    assert "- lora" in header and "- base_model:adapter:Qwen/Qwen2.5-0.5B-Instruct" in header
    assert "LoRA adapter (PEFT)" in body and "(https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct) on the Hub" in body
    assert "AutoPeftModelForCausalLM" in quick_start_code(body)


@pytest.mark.parametrize(
    ("name", "hub_id"),
    [
        ("Qwen/Qwen2.5-Math-1.5B-Instruct", True),
        ("gpt2", True),
        ("/abs/path/model", False),
        ("./outputs/model", False),
        ("~/models/x", False),
        ("a/b/c", False),
        (None, False),
    ],
)
def test_hub_id_or_none(name, hub_id):
    assert hub_id_or_none(name) == (name if hub_id else None)


def test_a_run_without_a_step_gets_no_card(tiny_model_dir, tmp_path, caplog):
    trainer = make_trainer(tiny_model_dir, tmp_path / "run", steps=0)
    trainer.create_model_card()
    assert not (tmp_path / "run" / "README.md").exists()
    assert "no training step" in caplog.text


def test_card_lists_the_rewards_with_their_weights_and_cites_trl(tiny_model_dir, tmp_path):
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path / "run",
        steps=6,
        reward_funcs=[math_verify_reward, boxed_format_reward],
        reward_weights=[1.0, 0.1],
    )
    _, body = header_and_body(str(build_model_card(trainer)))
    assert "| `math_verify_reward` | 1 |" in body and "| `boxed_format_reward` | 0.1 |" in body
    assert "trained with RiskPO" in body and "for 6 optimizer steps" in body
    # TRL's own cards cite TRL after the method.
    assert "Cite RiskPO as:" in body and "Cite TRL as:" in body and "@software{vonwerra2020trl," in body
    assert body.index("ren2025riskpo") < body.index("vonwerra2020trl")


def test_code_model_card_asks_a_programming_task(tiny_model_dir, tmp_path):
    def code_reward(completions, **kwargs):
        return [0.0] * len(completions)

    code = quick_start_code(str(build_model_card(make_trainer(tiny_model_dir, tmp_path, reward_funcs=code_reward))))
    assert "Fibonacci" in code and "7 * 8" not in code


@pytest.mark.slow
def test_quick_start_runs_as_written_from_another_directory(tiny_model_dir, tmp_path, monkeypatch):
    """Without hub_model_id the card points at the saved model by its absolute path, so the snippet runs as is."""
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer(tiny_model_dir, "relative-run")
    trainer.save_model()
    trainer.create_model_card()
    code = quick_start_code((tmp_path / "relative-run" / "README.md").read_text())
    assert f'model="{tmp_path / "relative-run"}"' in code
    code = code.replace("max_new_tokens=256", "max_new_tokens=4")  # same call, shorter
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_vision_language_card_quick_start_runs_an_image_text_pipeline(tmp_path, monkeypatch):
    from riskpo_trl.multimodal.tiny_vlm import build_tiny_vlm
    from riskpo_trl.rewards import geometry_accuracy_reward

    build_tiny_vlm(tmp_path / "tiny-vlm")
    args = RiskPOConfig(
        output_dir=str(tmp_path / "vlm-run"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        bundle_size=2,
    )
    trainer = job.build(
        RiskPOTrainer,
        str(tmp_path / "tiny-vlm"),
        reward_funcs=geometry_accuracy_reward,
        args=args,
        train_dataset=make_prompt_dataset(),
    )
    trainer.state.global_step = 1
    trainer.save_model()
    trainer.create_model_card()
    code = quick_start_code((tmp_path / "vlm-run" / "README.md").read_text())
    assert '"image-text-to-text"' in code and '"type": "image"' in code and "7 * 8" not in code
    result = subprocess.run(
        [sys.executable, "-c", code.replace("max_new_tokens=256", "max_new_tokens=4")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_settings_row_label_closes_its_parentheses(tmp_path):
    from riskpo_trl.job.model_card import settings_table

    args = tiny_config(
        tmp_path,
        run=False,
        use_cpu=True,
        bf16=False,
        loss_type="bnpo",
        loss_token_mean_sequences=10,
        regime_guard_patience=3,
    )
    rows = settings_table(args).splitlines()[2:]
    labels = [row.split(" | ")[0].removeprefix("| ") for row in rows]
    assert len(labels) > 15 and all(label.count("(") == label.count(")") for label in labels), labels
    assert (
        "| Regime guard threshold (the guard is opt-in: see regime_guard_patience) | `regime_guard_threshold=0.5` | "
        "`0.5` |" in rows
    )


def test_a_card_says_when_the_base_model_is_the_tiny_random_one(tiny_model_dir, tmp_path):
    from riskpo_trl.job.model_card import TINY_RANDOM_NOTE
    from riskpo_trl.tiny_model import TINY_MODEL_MARK

    trainer = make_trainer(tiny_model_dir, tmp_path / "run")
    body = header_and_body(str(build_model_card(trainer, dataset_files=["rows.jsonl"])))[1]
    assert TINY_RANDOM_NOTE in body and body.index(TINY_RANDOM_NOTE) < body.index("## Quick start")
    setattr(trainer.model.config, TINY_MODEL_MARK, False)  # as a real model's config: no mark
    trainer.model.config.name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
    assert "tiny random model" not in str(build_model_card(trainer))


def test_the_quick_start_asks_in_the_training_prompts_format(tiny_model_dir, tmp_path):
    """The card's question ends with the instruction the model was trained with, as a Python string that means it."""
    from datasets import Dataset

    from riskpo_trl.data import load_train_dataset

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"prompt": "What is {a} + 1?", "solution": "{a + 1}"}}\n' for a in range(16)))
    trainer = make_trainer(tiny_model_dir, tmp_path / "run")
    trainer.train_dataset = load_train_dataset("json", data_files=[str(rows)])
    code = quick_start_code(str(build_model_card(trainer)))
    messages = ast.literal_eval(re.search(r'\[\{"role": "user", "content": ".*?"\}\]', code).group(0))
    instruction = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert messages == [{"role": "user", "content": "What is 7 * 8?" + instruction}]
    trainer.train_dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": "What is 1 + 1?"}]}])
    assert '"What is 7 * 8?"' in quick_start_code(str(build_model_card(trainer)))  # no instruction trained: none asked
