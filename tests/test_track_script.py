"""The code and Geometry3K tracks through riskpo_trl.scripts.train: registry wiring, local files, tiny CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from datasets import Dataset
from helpers import TINY_ARCHER_SOLUTIONS, fenced, geometry3k_parquet
from PIL import Image
from transformers import AutoProcessor

from riskpo_trl.code import CodeReward, code_reward_from_settings
from riskpo_trl.scripts import train
from riskpo_trl.tracks import load_benchmark, load_train_dataset

ROOT = Path(__file__).resolve().parents[1]
CODE_RECIPE = ROOT / "recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_archer_code.yaml"
GEOMETRY_RECIPE = ROOT / "recipes/Qwen2.5-VL-3B-Instruct/riskpo/config_geometry3k.yaml"
# The paper recipes, shrunk to one CPU step: no vLLM server, no wandb, no bf16, 5 prompts x 2 completions.
CPU_OVERRIDES = [
    "--use_vllm",
    "false",
    "--report_to",
    "none",
    "--use_cpu",
    "true",
    "--bf16",
    "false",
    "--dtype",
    "float32",
    "--gradient_checkpointing",
    "false",
    "--num_generations",
    "2",
    "--per_device_train_batch_size",
    "10",
    "--gradient_accumulation_steps",
    "1",
    "--steps_per_generation",
    "1",
    "--max_completion_length",
    "8",
    "--max_steps",
    "1",
    "--warmup_steps",
    "0",
    "--save_strategy",
    "no",
    "--log_completions",
    "false",
]
TINY_ARCHER_CODE = ROOT / "examples/data/tiny_archer_code.jsonl"


def archer_rows(count: int) -> list[dict]:
    """Rows in ArcherCodeR's verl schema: chat prompt, reward_model.ground_truth as JSON (stdin or check code)."""
    rows = []
    for i in range(count):
        if i % 2 == 0:
            ground_truth = {"inputs": [f"{i}\n", f"{i + 1}\n"], "outputs": [f"{2 * i}\n", f"{2 * i + 2}\n"]}
        else:
            ground_truth = {"functional": "assert double(3) == 6\n"}
        rows.append(
            {
                "data_source": "codeforces",
                "ability": "code",
                "prompt": [{"role": "user", "content": f"Read n and print 2n. ({i})"}],
                "reward_model": {"style": "rule", "ground_truth": json.dumps(ground_truth)},
                "extra_info": {"index": i},
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run(recipe: Path, *overrides: str):
    script_args, training_args, model_args = train.parse_args(["--config", str(recipe), *CPU_OVERRIDES, *overrides])
    trainer = train.main(script_args, training_args, model_args)
    # The reward functions validated at parse time are the ones the trainer got: built once.
    assert all(a is b for a, b in zip(trainer.reward_funcs, script_args.reward_functions, strict=True))
    return trainer


# --- registry wiring (no training) ----------------------------------------------------------------------------------


def test_archer_code_files_become_prompt_and_tests(tmp_path):
    dataset = load_train_dataset("archer_code", data_files=str(write_jsonl(tmp_path / "a.jsonl", archer_rows(4))))
    assert dataset.column_names == ["prompt", "tests"]
    assert json.loads(dataset[0]["tests"])["style"] == "stdin" and json.loads(dataset[1]["tests"])["style"] == "assert"


def test_geometry3k_files_keep_their_images(tmp_path):
    dataset = load_benchmark("geometry3k_test", data_files=str(geometry3k_parquet(tmp_path / "g.parquet", 2)))
    assert set(dataset.column_names) == {"prompt", "images", "solution"}
    assert isinstance(dataset[1]["images"][0], Image.Image) and dataset[1]["solution"] == "1"


def test_bundled_tiny_archer_code_rows_are_solvable():
    """The smoke-run file's ground truths are right: a correct program passes each row, a wrong one does not."""
    dataset = load_train_dataset("archer_code", data_files=str(TINY_ARCHER_CODE))
    assert len(dataset) == len(TINY_ARCHER_SOLUTIONS)
    reward = code_reward_from_settings({"max_workers": 2})
    assert reward([fenced(code) for code in TINY_ARCHER_SOLUTIONS], dataset["tests"]) == [1.0] * len(dataset)
    assert reward([fenced("print(0)")] * len(dataset), dataset["tests"]) == [0.0] * len(dataset)


@pytest.mark.parametrize(
    ("name", "load", "expected_call"),
    [
        (
            "archer_code",
            load_train_dataset,
            (
                ("wizardII/ArcherCodeR-Dataset",),
                {"data_files": {"train": "train/archercoder-1.5b-train.json"}, "split": "train"},
            ),
        ),
        (
            "livecodebench_v5",
            load_benchmark,
            (
                ("wizardII/ArcherCodeR-Dataset",),
                {"data_files": {"test": "test/livecodebench_v5.json"}, "split": "test"},
            ),
        ),
        ("geometry3k", load_train_dataset, (("hiyouga/geometry3k",), {"split": "train"})),
        ("geometry3k_test", load_benchmark, (("hiyouga/geometry3k",), {"split": "test"})),
    ],
)
def test_track_names_read_the_papers_hub_files(monkeypatch, tmp_path, name, load, expected_call):
    """Offline: the Hub call each name makes, answered with local rows in that dataset's schema."""
    calls = []
    rows = (
        datasets.load_dataset("parquet", data_files=str(geometry3k_parquet(tmp_path / "g.parquet", 1)), split="train")
        if "geometry" in name
        else Dataset.from_list(archer_rows(1))
    )

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return rows

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert len(load(name)) == 1
    assert calls == [expected_call]


# --- end to end through the script ------------------------------------------------------------------------------


@pytest.mark.slow
def test_code_recipe_trains_through_the_script_with_the_sandboxed_reward(tmp_path):
    trainer = run(
        CODE_RECIPE,
        "--model_name_or_path",
        str(tmp_path / "tiny-model"),
        "--build_tiny_model",
        "true",
        "--dataset_files",
        str(TINY_ARCHER_CODE),
        "--output_dir",
        str(tmp_path / "run"),
        "--code_sandbox",
        json.dumps({"max_workers": 2, "test_timeout_s": 2, "total_timeout_s": 5}),
    )
    assert type(trainer).__name__ == "RiskPOTrainer" and trainer.state.global_step == 1
    [reward] = trainer.reward_funcs
    assert isinstance(reward, CodeReward) and reward.sandbox.max_workers == 2
    assert reward.sandbox.limits.total_timeout_s == 5
    # The tiny model writes no code, so every completion scores 0.0; None (NaN mean) would mean the tests were lost.
    [logs] = [entry for entry in trainer.state.log_history if "rewards/code_reward/mean" in entry]
    assert logs["rewards/code_reward/mean"] == 0.0
    # A correct program passes the adapted tests of the training rows, through the trainer's own reward.
    tests = trainer.train_dataset[0]["tests"]
    assert reward([fenced(TINY_ARCHER_SOLUTIONS[0]), fenced("print(0)")], [tests, tests]) == [1.0, 0.0]
    assert (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.slow
def test_geometry3k_recipe_trains_a_tiny_vlm_through_the_script(tmp_path):
    data = geometry3k_parquet(tmp_path / "geometry3k.parquet", 10)
    trainer = run(
        GEOMETRY_RECIPE,
        "--model_name_or_path",
        str(tmp_path / "tiny-vlm"),
        "--build_tiny_vlm",
        "true",
        "--dataset_files",
        str(data),
        "--output_dir",
        str(tmp_path / "run"),
    )
    # The recipe's wiring: the VLM built and loaded with its processor, the Geometry3K rows with their images, the
    # geometry reward. (That images reach the gradient is tested on the trainer, in test_multimodal.py.)
    assert type(trainer).__name__ == "RiskPOTrainer" and trainer.state.global_step == 1
    assert type(trainer.processing_class).__name__ == "LlavaProcessor"
    assert "images" in trainer.train_dataset.column_names
    [logs] = [entry for entry in trainer.state.log_history if "rewards/geometry_accuracy_reward/mean" in entry]
    assert 0.0 <= logs["rewards/geometry_accuracy_reward/mean"] <= 1.0
    # The processor is saved with the model, so the output reloads as a VLM.
    assert type(AutoProcessor.from_pretrained(tmp_path / "run")).__name__ == "LlavaProcessor"
