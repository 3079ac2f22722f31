"""RiskPO with a PEFT LoRA adapter: the adapter trains (the base weights do not), saves with its card, resumes from a
checkpoint exactly, and the tiny LoRA recipe runs through the script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config
from peft import LoraConfig
from safetensors.torch import load_file

from riskpo_trl import RiskPOTrainer, job
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
LORA_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic_lora.yaml"


def lora_trainer(model_dir: str, output_dir: Path, max_steps: int) -> RiskPOTrainer:
    args = tiny_config(
        output_dir,
        run=False,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=1,
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        bundle_size=2,
        max_completion_length=8,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=11,
    )
    peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return job.build(
        RiskPOTrainer,
        model_dir,
        reward_funcs=contains_digit_reward,
        args=args,
        peft_config=peft_config,
        train_dataset=make_prompt_dataset(),
    )


def lora_weights(trainer: RiskPOTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_" in name}


@pytest.mark.slow
def test_the_adapter_trains_saves_with_its_card_and_resumes(tiny_model_dir, tmp_path):
    full = lora_trainer(tiny_model_dir, tmp_path / "full", max_steps=3)
    base_before = {name: p.detach().clone() for name, p in full.model.named_parameters() if "lora_" not in name}
    full.train()
    # Only the adapter moved: LoRA's B matrices start at zero and are no longer.
    assert all(not p.requires_grad for name, p in full.model.named_parameters() if "lora_" not in name)
    for name, p in full.model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(p, base_before[name]), name
    assert any(w.abs().sum() > 0 for name, w in lora_weights(full).items() if "lora_B" in name)

    full.save_model()
    full.create_model_card()
    output = tmp_path / "full"
    assert (output / "adapter_config.json").is_file() and (output / "adapter_model.safetensors").is_file()
    assert not (output / "model.safetensors").exists()  # the adapter only, not a copy of the base model
    card = (output / "README.md").read_text()
    assert "trained with RiskPO" in card and "for 3 optimizer steps" in card

    # Resume from step 1 in a new trainer: the adapter loads as saved and the run ends where the uninterrupted one did.
    checkpoint = output / "checkpoint-1"
    saved = load_file(checkpoint / "adapter_model.safetensors")
    resumed = lora_trainer(tiny_model_dir, tmp_path / "resumed", max_steps=3)
    resumed._load_from_checkpoint(str(checkpoint))
    loaded = lora_weights(resumed)
    assert len(saved) == len(loaded)
    for name, tensor in saved.items():
        [match] = [w for key, w in loaded.items() if key.replace(".default", "") == name]
        assert torch.equal(match, tensor), name
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 3
    final, again = lora_weights(full), lora_weights(resumed)
    for name in final:
        assert torch.allclose(final[name], again[name], atol=1e-6), name


@pytest.mark.slow
def test_the_tiny_lora_recipe_runs_through_the_script(tmp_path):
    trainer = train.main(
        *train.parse_args(
            [
                "--config",
                str(LORA_RECIPE),
                "--model_name_or_path",
                str(tmp_path / "tiny"),
                "--output_dir",
                str(tmp_path / "run"),
                "--dataset_files",
                str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
                "--max_steps",
                "1",
                "--max_completion_length",
                "8",
            ]
        )
    )
    assert type(trainer.model).__name__.startswith("Peft") and trainer.state.global_step == 1
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file()
    assert "trained with RiskPO" in (tmp_path / "run" / "README.md").read_text()


@pytest.mark.slow
def test_a_lora_run_from_a_relative_path_gives_an_adapter_and_card_that_load_from_anywhere(tmp_path, monkeypatch):
    """The base model is a relative local path: adapter_config.json records it absolute, the card says it is a LoRA
    adapter on a local base model (PEFT metadata, no Hub base_model), and its quick start runs from another
    directory."""
    monkeypatch.chdir(tmp_path)
    train.main(
        *train.parse_args(
            [
                "--config",
                str(LORA_RECIPE),
                "--model_name_or_path",
                "./tiny",
                "--output_dir",
                "run",
                "--dataset_files",
                str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
                "--max_steps",
                "1",
                "--max_completion_length",
                "8",
                "--save_strategy",
                "no",
            ]
        )
    )
    adapter = json.loads((tmp_path / "run" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tmp_path / "tiny")
    card = (tmp_path / "run" / "README.md").read_text()
    _, header, body = card.split("---\n", 2)
    assert "library_name: peft" in header and "base_model" not in header  # a local base is no Hub id
    assert "- peft" in header and "- lora" in header
    assert "LoRA adapter (PEFT), not a full model" in body
    assert f"The base model is the local directory `{tmp_path / 'tiny'}`, not a Hub model" in body
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", card, re.DOTALL).group(1)
    assert "AutoPeftModelForCausalLM.from_pretrained" in code and f'"{tmp_path / "run"}"' in code
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = code.replace("max_new_tokens=256", "max_new_tokens=4")  # same call, shorter
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
