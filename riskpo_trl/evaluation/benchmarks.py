"""The benchmarks an evaluation runs on: registry names, local rows files, and the prompt text the model continues."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset

from ..data import BENCHMARKS, load_benchmark
from ..data.prompts import make_prompt
from .config import EvalConfig


@dataclass
class Benchmark:
    name: str
    dataset: Dataset
    kind: str  # "math", "code" or "geometry": which scorer grades it (riskpo_trl.evaluation.scorers)


def load_rows_file(path: str | os.PathLike) -> Dataset:
    """A local benchmark: JSON (a list of rows) or JSONL rows with ``problem`` and ``answer`` (``prompt`` optional)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Dataset file {str(path)!r} does not exist.")
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = json.loads(text)
        if isinstance(rows, dict) and "data" in rows:
            rows = rows["data"]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: expected a non-empty list of rows (JSON array or one JSON object per line).")
    for i, row in enumerate(rows):
        missing = [key for key in ("problem", "answer") if key not in row]
        if missing:
            raise ValueError(f"{path}, row {i}: missing field(s) {missing}; each row needs `problem` and `answer`.")
    return Dataset.from_list([{**row, "answer": str(row["answer"])} for row in rows])


def local_label(benchmark: str, path: str) -> str:
    """The name results carry for ``benchmark`` read from the local file ``path``: ``NAME=FILE``, as it was given."""
    return f"{benchmark}={Path(path).name}"


def check_benchmark_names(config: EvalConfig) -> None:
    BENCHMARKS.check_all([entry.partition("=")[0] for entry in config.benchmarks], otherwise=" or use --dataset_files")


def resolve_benchmarks(config: EvalConfig) -> list[Benchmark]:
    """All benchmarks of ``config``; fails on unknown names before any data or model is loaded."""
    check_benchmark_names(config)
    benchmarks = []
    for entry in config.benchmarks:
        name, _, path = entry.partition("=")
        dataset = load_benchmark(name, data_files=path or None)
        # Rows from a local file are labelled with it: a few rows of one's own must not pass for the Hub benchmark.
        benchmarks.append(Benchmark(local_label(name, path) if path else name, dataset, BENCHMARKS[name].kind))
    benchmarks += [Benchmark(Path(path).stem, load_rows_file(path), "math") for path in config.dataset_files]
    names = [benchmark.name for benchmark in benchmarks]
    if len(set(names)) != len(names):
        raise ValueError(f"Benchmark names must be unique, got {names}; rename the dataset files.")
    if config.max_problems is not None:
        for benchmark in benchmarks:
            benchmark.dataset = benchmark.dataset.select(range(min(config.max_problems, len(benchmark.dataset))))
    return benchmarks


def render_prompt(row: dict[str, Any], tokenizer) -> str:
    """The text the model continues: the row's chat ``prompt`` (or its problem plus the instruction) through the
    tokenizer's chat template, with the assistant turn opened. A row with ``images`` shows them at the start of its
    first user turn, as TRL does in training."""
    prompt = row.get("prompt") or make_prompt(row["problem"])  # the step-by-step, boxed-answer instruction
    if isinstance(prompt, str):
        return prompt
    if row.get("images"):
        prompt = _with_image_parts(prompt, len(row["images"]))
    if getattr(tokenizer, "chat_template", None) is None:
        return "\n".join(_message_text(message) for message in prompt) + "\n"
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def _with_image_parts(prompt: list[dict[str, Any]], num_images: int) -> list[dict[str, Any]]:
    messages = [dict(message) for message in prompt]
    first_user = next(i for i, message in enumerate(messages) if message["role"] == "user")
    content = messages[first_user]["content"]
    text_parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    messages[first_user]["content"] = [{"type": "image"}] * num_images + text_parts
    return messages


def _message_text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def problem_text(row: dict[str, Any]) -> str:
    """The problem as stored with its samples: the ``problem`` column, else the prompt's last user turn."""
    if row.get("problem"):
        return row["problem"]
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    return _message_text([message for message in prompt if message["role"] == "user"][-1])
