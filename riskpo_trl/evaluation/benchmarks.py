"""The benchmarks an evaluation runs on: registry names, local rows files, and the prompt text the model continues."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset

from ..data.columns import check_columns_exist, gold_answer
from ..data.local_files import check_data_files
from ..data.prompts import (
    DEFAULT_PROMPT_TEMPLATE,
    PROMPT_BUILDERS,
    RAW_PROMPT_TEMPLATE,
    instruction_in_chat_template,
    make_prompt,
    prompt_from_text,
    without_instruction,
)
from ..tracks import BENCHMARKS, load_benchmark
from .config import EvalConfig


@dataclass
class Benchmark:
    name: str
    dataset: Dataset
    kind: str  # "math", "code" or "geometry": which scorer grades it (riskpo_trl.evaluation.scorers)
    prompt: str = ""  # where its prompts come from, for results.md


def template_description(prompt_template: str) -> str:
    """A prompt template as results.md states it: its name and the text a problem becomes."""
    prompt = PROMPT_BUILDERS[prompt_template]("{problem}")
    return f"`{prompt_template}`: {prompt if isinstance(prompt, str) else prompt[-1]['content']!r}"


def load_rows_file(
    path: str | os.PathLike,
    prompt_column: str | None = None,
    answer_column: str | None = None,
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
) -> Dataset:
    """A local benchmark: JSON (a list of rows) or JSONL rows in either schema, with columns ``problem`` and
    ``answer`` (the problem is prompted with ``prompt_template``), or riskpo-train's ``prompt`` and ``solution``
    (chat messages used as they are; a text prompted as a problem is, as in training; ``raw``: kept as text).
    ``prompt_column`` and ``answer_column`` name other columns; a GSM8K answer (``... #### 42``) is read as the text
    after its last ``####``. The rows get ``prompt`` (and ``problem`` where it was text), and the gold ``answer``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Dataset file {str(path)!r} does not exist.")
    check_data_files([str(path)])  # not empty, not nested deeper than the JSON readers take
    rows = _read_rows(path)
    columns = list(dict.fromkeys(key for row in rows for key in row))
    gold = answer_column or next((c for c in ("answer", "solution") if c in columns), None)
    prompt = prompt_column or ("prompt" if "prompt" in columns else None)
    check_columns_exist(columns, {"answer_column": answer_column, "prompt_column": prompt_column}, str(path))
    wanted = [gold or "answer", prompt or "problem"]
    for i, row in enumerate(rows):
        missing = [key for key in wanted if key not in row]
        if missing:
            raise ValueError(
                f"{path}, row {i}: missing field(s) {missing}; each row needs `problem` and `answer`, or `prompt` and "
                "`solution` as riskpo-train reads them (its columns: " + ", ".join(row) + "). --answer_column NAME "
                "and --prompt_column NAME name other columns."
            )
    return Dataset.from_list([_prompted_row(row, prompt, gold, prompt_template) for row in rows])


def _prompted_row(row: dict[str, Any], prompt: str | None, gold: str, prompt_template: str) -> dict[str, Any]:
    """A rows file's row: its chat ``prompt`` as it is; a text prompt (or a ``problem``) as its ``problem``, prompted
    with ``prompt_template`` as training prompts it (``raw``: a text prompt kept as it is)."""
    answer = gold_answer(row[gold])
    if prompt and (not isinstance(row[prompt], str) or prompt_template == RAW_PROMPT_TEMPLATE):
        return {"prompt": row[prompt], "answer": answer}
    problem = row[prompt] if prompt else row["problem"]
    return {"problem": problem, "prompt": prompt_from_text(problem, prompt_template), "answer": answer}


def rows_file_prompt(dataset: Dataset, prompt_column: str | None, prompt_template: str) -> str:
    """Where the prompts of a rows file (as :func:`load_rows_file` read it) come from, for results.md."""
    if "problem" in dataset.column_names:
        return template_description(prompt_template)
    return f"the file's own `{prompt_column or 'prompt'}` column, as it is"


def _read_rows(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}, line {number}: not JSON ({error}).") from None
    else:
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON ({error}).") from None
        if isinstance(rows, dict) and "data" in rows:
            rows = rows["data"]
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise ValueError(f"{path}: expected a non-empty list of rows (JSON array or one JSON object per line).")
    return rows


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
        kind = BENCHMARKS[name].kind
        template = {"prompt_template": config.prompt_template} if kind == "math" else {}
        dataset = load_benchmark(name, data_files=path or None, **template)
        prompt = template_description(config.prompt_template) if template else f"the {kind} track's own prompt"
        # Rows from a local file are labelled with it: a few rows of one's own must not pass for the Hub benchmark.
        benchmarks.append(Benchmark(local_label(name, path) if path else name, dataset, kind, prompt))
    for path in config.dataset_files:
        dataset = load_rows_file(path, config.prompt_column, config.answer_column, config.prompt_template)
        prompt = rows_file_prompt(dataset, config.prompt_column, config.prompt_template)
        benchmarks.append(Benchmark(Path(path).stem, dataset, "math", prompt))
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
    prompt = without_instruction(prompt, _instruction_in_chat_template(tokenizer))  # once, as in training
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


_INSTRUCTIONS_WRITTEN: dict[str, str | None] = {}


def _instruction_in_chat_template(tokenizer) -> str | None:
    """:func:`instruction_in_chat_template`, once per chat template."""
    template = str(tokenizer.chat_template)
    if template not in _INSTRUCTIONS_WRITTEN:
        _INSTRUCTIONS_WRITTEN[template] = instruction_in_chat_template(tokenizer)
    return _INSTRUCTIONS_WRITTEN[template]


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
