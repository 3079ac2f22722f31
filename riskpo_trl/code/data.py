"""Dataset adapters of the code track: Archer-style training rows and LiveCodeBench problems -> prompt + tests.

Every adapter returns ``{"prompt": [{"role": "user", "content": ...}], "tests": TestSpec JSON}``, which is what
`RiskPOTrainer` (TRL's conversational prompts) and `code_reward` (the ``tests`` column) consume.

Schemas (checked against the sources, not guessed):

* ArcherCodeR (https://huggingface.co/datasets/wizardII/ArcherCodeR-Dataset, files ``train/archercoder-1.5b-train.json``
  and ``test/livecodebench_v5.json``; training code https://github.com/wizard-III/ArcherCodeR): verl-style rows with a
  ``prompt`` (a string or chat messages; ``data.prompt_key=prompt`` in its training script) and the ground truth under
  ``reward_model.ground_truth`` (the successor ``Fate-Zero/Archer2.0-Code-1.5B`` has a top-level ``ground_truth``
  string). The ground truth is a JSON string, one of: ``{"inputs": [...], "outputs": [...]}`` (stdin/stdout tests),
  ``{"functional": "<test code calling check(Solution().method)>"}`` (run after the program, see
  ``rewards/code_utils/utils.py::grade_answer_code``), or, for LiveCodeBench rows, a list of LiveCodeBench test cases
  ``[{"input", "output", "testtype", "metadata": {"func_name"}}]`` (``rewards/general_reward.py``).
* LiveCodeBench (https://huggingface.co/datasets/livecodebench/code_generation_lite): ``question_content``,
  ``starter_code``, ``platform``, ``contest_date``, ``difficulty``, ``public_test_cases`` (JSON string of a list of
  ``{"input", "output", "testtype": "stdin"|"functional"}``), ``private_test_cases`` (the same JSON, or that JSON
  pickled, zlib-compressed and base64-encoded, as LiveCodeBench's ``CodeGenerationProblem`` decodes it) and
  ``metadata`` (JSON string, ``func_name`` for functional problems). Releases are jsonl files: ``release_v5`` is
  ``test.jsonl`` ... ``test5.jsonl`` (the dataset script's ``ALLOWED_FILES``).

Decoding the compressed private tests means unpickling downloaded data, which can execute arbitrary code if the file
was tampered with. It is therefore off unless you pass ``allow_pickle=True`` for a source you trust.

Assert-style check code that the trainer cannot judge without trusting the program's own report (an expected value
computed in the check code, an assertion on a path only the sandbox knows; `riskpo_trl.code.assertions`) raises
`UndecidableTestError` in the row adapters; `load_archer_code` drops such rows and logs how many and why.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import pickle
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from ..data.isolated_build import load_dataset_isolated
from ..data.local_files import load_local_files
from ..registry import closest_name
from .assertions import UndecidableTestError
from .testspec import TestSpec

logger = logging.getLogger(__name__)

LIVECODEBENCH_ID = "livecodebench/code_generation_lite"
ARCHER_CODE_ID = "wizardII/ArcherCodeR-Dataset"
LIVECODEBENCH_RELEASE_FILES = {
    f"release_v{v}": ["test.jsonl"] + [f"test{i}.jsonl" for i in range(2, v + 1)] for v in range(1, 7)
}

STDIN_INSTRUCTION = (
    "Write a Python 3 program that reads the input from standard input and writes the answer to standard output. "
    "Give the complete program in one ```python code block at the end of your answer."
)
STARTER_INSTRUCTION = (
    "Complete the following starter code in Python 3 and give the whole solution in one ```python code block at the "
    "end of your answer:\n```python\n{starter_code}\n```"
)


def code_prompt(question: str, starter_code: str | None = None) -> list[dict[str, str]]:
    """The user turn of a code problem: its statement plus how to answer (stdin program, or complete the starter)."""
    instruction = STARTER_INSTRUCTION.format(starter_code=starter_code.strip()) if starter_code else STDIN_INSTRUCTION
    return [{"role": "user", "content": f"{question.strip()}\n\n{instruction}"}]


# --- LiveCodeBench -------------------------------------------------------------------------------------------------


def decode_livecodebench_tests(field: str, allow_pickle: bool = False) -> list[dict[str, Any]]:
    """Test cases of a ``public_test_cases`` / ``private_test_cases`` cell: plain JSON, or compressed JSON."""
    try:
        return json.loads(field)
    except ValueError:
        pass
    if not allow_pickle:
        raise ValueError(
            "private_test_cases is compressed (base64 + zlib + pickle). Unpickling runs code from the file if it was "
            "tampered with; pass allow_pickle=True only for a copy of livecodebench/code_generation_lite you trust."
        )
    unpickled = pickle.loads(zlib.decompress(base64.b64decode(field.encode("utf-8"))))  # noqa: S301 - opt-in above
    return json.loads(unpickled)


def livecodebench_tests_to_spec(cases: list[Mapping[str, Any]], fn_name: str | None) -> TestSpec:
    """A `TestSpec` from LiveCodeBench test cases, which all share one ``testtype``."""
    if not cases:
        raise ValueError("A LiveCodeBench problem needs at least one test case; got none.")
    styles = {case.get("testtype", "stdin") for case in cases}
    if len(styles) != 1 or not styles <= {"stdin", "functional"}:
        raise ValueError(f"LiveCodeBench test cases must all be 'stdin' or all 'functional'; got {sorted(styles)}.")
    style = styles.pop()
    if style == "functional" and not fn_name:
        raise ValueError("Functional LiveCodeBench tests need metadata.func_name (the Solution method to call).")
    return TestSpec(
        style, [c["input"] for c in cases], [c["output"] for c in cases], fn_name if style == "functional" else None
    )


def livecodebench_to_riskpo(
    row: Mapping[str, Any], allow_pickle: bool = False, include_private: bool = True
) -> dict[str, Any]:
    """Map a ``livecodebench/code_generation_lite`` row to ``prompt`` + ``tests`` (public, then private tests)."""
    metadata = row.get("metadata") or "{}"
    metadata = json.loads(metadata) if isinstance(metadata, str) else dict(metadata)
    cases = decode_livecodebench_tests(row["public_test_cases"], allow_pickle)
    if include_private and row.get("private_test_cases"):
        cases += decode_livecodebench_tests(row["private_test_cases"], allow_pickle)
    spec = livecodebench_tests_to_spec(cases, metadata.get("func_name"))
    return {"prompt": code_prompt(row["question_content"], row.get("starter_code")), "tests": spec.to_json()}


def load_livecodebench(
    release: str = "release_v5", start_date: str | None = None, end_date: str | None = None, allow_pickle: bool = False
):
    """LiveCodeBench problems of a release (optionally a ``contest_date`` window, ISO dates) as prompt + tests.

    The paper evaluates on LiveCodeBench v5; a common choice is the 2024-08-01 .. 2025-02-01 window of release_v5.
    """
    if release not in LIVECODEBENCH_RELEASE_FILES:
        raise ValueError(
            f"release={release!r} is unknown{closest_name(release, LIVECODEBENCH_RELEASE_FILES)}; choose "
            f"one of {sorted(LIVECODEBENCH_RELEASE_FILES)}."
        )
    files = [f"hf://datasets/{LIVECODEBENCH_ID}/{name}" for name in LIVECODEBENCH_RELEASE_FILES[release]]
    dataset = load_dataset_isolated("json", data_files=files, split="train")
    if start_date or end_date:
        dataset = dataset.filter(lambda row: (start_date or "") <= row["contest_date"][:10] < (end_date or "9999"))
    keep = ["question_id", "platform", "difficulty", "contest_date"]
    return dataset.map(
        lambda row: livecodebench_to_riskpo(row, allow_pickle),
        remove_columns=[c for c in dataset.column_names if c not in keep],
    )


# --- Archer --------------------------------------------------------------------------------------------------------


def archer_ground_truth_to_spec(ground_truth: str | Mapping | list) -> TestSpec:
    """A `TestSpec` from an Archer ground truth (JSON string or decoded): stdin tests, check code, or LCB cases."""
    data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(data, list):  # LiveCodeBench-format rows of Archer's test file
        return livecodebench_tests_to_spec(data, (data[0].get("metadata") or {}).get("func_name") if data else None)
    if isinstance(data, Mapping) and "functional" in data:
        return TestSpec("assert", [data["functional"]], [""])
    if isinstance(data, Mapping) and "inputs" in data and "outputs" in data:
        inputs, outputs = data["inputs"], data["outputs"]
        if not all(isinstance(x, str) for x in [*inputs, *outputs]):
            raise ValueError("Archer stdin tests need string inputs and outputs (ground_truth.inputs / .outputs).")
        return TestSpec("stdin", list(inputs), list(outputs))
    raise ValueError(
        "ground_truth must be JSON with 'inputs' and 'outputs' (stdin tests), 'functional' (test code), or a list of "
        f"LiveCodeBench test cases; got {str(ground_truth)[:120]!r}."
    )


def archer_to_riskpo(row: Mapping[str, Any]) -> dict[str, Any]:
    """Map an Archer code row (verl-style ``reward_model.ground_truth`` or top-level ``ground_truth``)."""
    if isinstance(row.get("reward_model"), Mapping) and "ground_truth" in row["reward_model"]:
        ground_truth = row["reward_model"]["ground_truth"]
    elif "ground_truth" in row:
        ground_truth = row["ground_truth"]
    else:
        raise ValueError("An Archer row needs reward_model.ground_truth or ground_truth; found neither.")
    prompt = row["prompt"]
    if isinstance(prompt, str):  # the prompt already carries Archer's own instructions
        prompt = [{"role": "user", "content": prompt}]
    else:
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    return {"prompt": prompt, "tests": archer_ground_truth_to_spec(ground_truth).to_json()}


def load_archer_code(split: str = "train", data_files: str | list[str] | None = None):
    """Archer's code training set (``split="train"``) or its LiveCodeBench v5 test file (``split="test"``).

    ``data_files``: local JSON/JSONL/Parquet files in Archer's schema, read instead of the Hub (``split`` is unused).
    """
    if data_files is not None:
        dataset = load_local_files(data_files)
    else:
        files = {"train": "train/archercoder-1.5b-train.json", "test": "test/livecodebench_v5.json"}
        if split not in files:
            raise ValueError(f"split={split!r} is unknown; choose 'train' or 'test'.")
        dataset = load_dataset_isolated(ARCHER_CODE_ID, data_files={split: files[split]}, split=split)
    dataset = drop_undecidable(dataset, archer_to_riskpo, "load_archer_code")
    return dataset.map(archer_to_riskpo, remove_columns=dataset.column_names)


def drop_undecidable(dataset, to_riskpo: Callable[[Mapping[str, Any]], dict], loader: str):
    """``dataset`` without the rows whose tests `to_riskpo` refuses as `UndecidableTestError`, logging how many were
    dropped and the commonest reasons (other errors still raise: they are a broken schema, not a test form)."""
    reasons: collections.Counter[str] = collections.Counter()

    def judgeable(row) -> bool:
        try:
            to_riskpo(row)
        except UndecidableTestError as exc:
            reasons[exc.kind] += 1
            return False
        return True

    kept = dataset.filter(judgeable, load_from_cache_file=False)
    dropped = len(dataset) - len(kept)
    if dropped:
        common = "; ".join(f"{count} x {reason}" for reason, count in reasons.most_common(3))
        logger.warning(
            "%s: dropped %d of %d rows whose assert-style tests the trainer cannot judge without trusting "
            "the program (%s). See docs/code_sandbox.md.",
            loader,
            dropped,
            len(dataset),
            common,
        )
    return kept
