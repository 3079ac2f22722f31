"""The model card of a run says what the run was: its name, its base model, its data and its risk settings."""

from __future__ import annotations

import pytest

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.model_card import build_model_card, hub_id_or_none

from helpers import contains_digit_reward, make_prompt_dataset


def make_trainer(model_dir, output_dir, **overrides) -> RiskPOTrainer:
    settings = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", num_generations=4,
        per_device_train_batch_size=16, gradient_accumulation_steps=1, bundle_size=2,
    )
    args = RiskPOConfig(**{**settings, **overrides})
    return RiskPOTrainer(model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset())


def header_and_body(card: str) -> tuple[str, str]:
    _, header, body = card.split("---\n", 2)
    return header, body


def test_local_run_card_names_the_output_dir_and_no_hub_ids(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path / "tiny-riskpo-run", risk_omega=1.0, bundle_size=4)
    trainer.create_model_card(dataset_files=["data/train/tiny_arithmetic.jsonl"])
    card = (tmp_path / "tiny-riskpo-run" / "README.md").read_text()
    header, body = header_and_body(card)
    assert "None" not in card
    assert "# Model Card for tiny-riskpo-run" in body
    assert "base_model" not in header and "datasets" not in header  # a local model and a local file
    assert "huggingface.co/datasets" not in body and "`tiny_arithmetic.jsonl`" in body
    assert f'model="{tmp_path / "tiny-riskpo-run"}"' in body
    # The risk settings, with RiskPOConfig's (the paper's) defaults beside them.
    assert "| alpha (lower quantile level) | `risk_alpha=0.2` | `0.2` |" in body
    assert "| omega (extra weight of the lower tail) | `risk_omega=1.0` | `0.5` |" in body
    assert "| B (prompts per bundle) | `bundle_size=4` | `5` |" in body
    assert "`risk_beta=0.8`" in body and "`quantile_source=tracked`" in body
    for name in ("natural_baseline", "credit_assignment", "bundling", "advantage_scaling"):  # the opt-ins
        assert f"`{name}={getattr(trainer.args, name)}`" in body
    assert "2510.00911" in body and "ren2025riskpo" in body
    assert "- riskpo" in header and "- trl" in header


def test_hub_run_card_names_the_hub_repo_base_model_and_datasets(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path / "out", hub_model_id="someone/tiny-riskpo-gsm8k")
    # A model loaded from the Hub records its id; the tiny model here is local, so set what loading would.
    trainer.model.config._name_or_path = "Qwen/Qwen2.5-Math-1.5B-Instruct"
    card = str(build_model_card(trainer, datasets=["openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval"]))
    header, body = header_and_body(card)
    assert "# Model Card for tiny-riskpo-gsm8k" in body
    assert "base_model: Qwen/Qwen2.5-Math-1.5B-Instruct" in header
    assert "- openai/gsm8k" in header and "- DigitalLearningGmbH/MATH-lighteval" in header
    assert "(https://huggingface.co/Qwen/Qwen2.5-Math-1.5B-Instruct)" in body
    assert "(https://huggingface.co/datasets/openai/gsm8k)" in body
    assert 'model="someone/tiny-riskpo-gsm8k"' in body


@pytest.mark.parametrize(
    ("name", "hub_id"),
    [("Qwen/Qwen2.5-Math-1.5B-Instruct", True), ("gpt2", True), ("/abs/path/model", False),
     ("./outputs/model", False), ("~/models/x", False), ("a/b/c", False), (None, False)],
)
def test_hub_id_or_none(name, hub_id):
    assert hub_id_or_none(name) == (name if hub_id else None)
