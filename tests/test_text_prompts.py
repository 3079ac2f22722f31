"""A text prompt column (``--prompt_column``, a JSONL or CSV of strings) is prompted as the registered datasets prompt
their problems: one user turn carrying the template's instruction. ``prompt_template: raw`` keeps the text."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets import Dataset

from riskpo_trl.data import PROMPT_TEMPLATE, load_train_dataset
from riskpo_trl.evaluation.benchmarks import load_rows_file
from riskpo_trl.scripts.train import check_chat_template

GSM8K_ROWS = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "48/2 = 24\n#### 72",
    },
    {"question": "A pen costs $3. How much do 4 pens cost?", "answer": "3 * 4 = 12\n#### 12"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("template", ["qwen_boxed", "authors"])
def test_a_gsm8k_file_read_as_it_is_gets_the_prompt_of_the_registered_gsm8k(tmp_path, template):
    """docs/training.md's own-data command (json, --prompt_column question --answer_column answer) and the
    registered adapter on the same file give the same prompts and gold answers."""
    rows = str(write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS))
    own = load_train_dataset(
        "json", data_files=[rows], prompt_column="question", answer_column="answer", prompt_template=template
    )
    registered = load_train_dataset("gsm8k", data_files=[rows], prompt_template=template)
    assert own["prompt"] == registered["prompt"]
    assert own["solution"] == registered["solution"] == ["72", "12"]
    assert own["prompt"][0][0]["role"] == "user" and len(own["prompt"][0]) == 1
    if template == "qwen_boxed":
        assert own["prompt"][0][0]["content"] == PROMPT_TEMPLATE.format(problem=GSM8K_ROWS[0]["question"])


def test_a_csv_of_text_prompts_becomes_chat_turns_and_raw_keeps_the_text(tmp_path):
    path = tmp_path / "rows.csv"
    Dataset.from_list([{"prompt": "What is 2 + 3?", "solution": "5"}]).to_csv(path)
    prompted = load_train_dataset("csv", data_files=[str(path)])
    assert prompted[0]["prompt"] == [{"role": "user", "content": PROMPT_TEMPLATE.format(problem="What is 2 + 3?")}]
    raw = load_train_dataset("csv", data_files=[str(path)], prompt_template="raw")
    assert raw[0]["prompt"] == "What is 2 + 3?"


def test_chat_prompts_stay_as_they_are_and_refuse_another_template(tmp_path):
    messages = [{"role": "user", "content": "What is 2 + 3? Box it."}]
    rows = str(write_jsonl(tmp_path / "chat.jsonl", [{"prompt": messages, "solution": "5"}]))
    assert load_train_dataset("json", data_files=[rows])[0]["prompt"] == messages
    with pytest.raises(ValueError, match="applies to a text prompt column; the 'prompt' column of .* holds chat"):
        load_train_dataset("json", data_files=[rows], prompt_template="authors")


def test_raw_is_refused_for_a_registered_dataset(tmp_path):
    rows = str(write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS))
    with pytest.raises(
        ValueError, match="prompt_template='raw' keeps the text prompt column .* 'gsm8k' is registered"
    ):
        load_train_dataset("gsm8k", data_files=[rows], prompt_template="raw")


def test_an_evaluation_rows_file_prompts_text_as_training_does(tmp_path):
    rows = write_jsonl(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    evaluated = load_rows_file(rows, prompt_column="question", answer_column="answer")
    trained = load_train_dataset("json", data_files=[str(rows)], prompt_column="question", answer_column="answer")
    assert evaluated["prompt"] == trained["prompt"] and evaluated["answer"] == ["72", "12"]
    assert load_rows_file(rows, "question", "answer", "raw")["prompt"] == [row["question"] for row in GSM8K_ROWS]


def test_chat_prompts_for_a_model_without_a_chat_template_are_one_clear_error():
    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": "2 + 3?"}], "solution": "5"}])
    with pytest.raises(ValueError, match="no chat template .* prompt_template raw"):
        check_chat_template(SimpleNamespace(chat_template=None), chat)
    check_chat_template(SimpleNamespace(chat_template="{{ messages }}"), chat)  # a template renders them
    check_chat_template(SimpleNamespace(chat_template=None), Dataset.from_list([{"prompt": "2 + 3?"}]))  # text
