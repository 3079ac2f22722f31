"""Geometry3K for vision-language RiskPO: adapter to TRL's VLM dataset format (graded by
``riskpo_trl.rewards.geometry_accuracy_reward``, the math track's final-answer verifier).

Schema of https://huggingface.co/datasets/hiyouga/geometry3k (dataset card): ``images`` (a list of images, one diagram),
``problem`` (text with an ``<image>`` placeholder), ``answer`` (string), ``id``, ``choices``, ``ground_truth``; splits
train (2,101) / validation (300) / test (601). The paper trains on train and tests on test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..data.isolated_build import load_dataset_isolated
from ..data.local_files import load_local_files
from ..data.prompts import PROMPT_TEMPLATE

GEOMETRY3K_ID = "hiyouga/geometry3k"


def geometry3k_to_riskpo(row: Mapping[str, Any]) -> dict[str, Any]:
    """``prompt`` (conversational; TRL inserts the image into the user turn), ``images`` and ``solution``."""
    images = row.get("images")
    if images is None and row.get("image") is not None:
        images = [row["image"]]
    if not images:
        raise ValueError("A Geometry3K row needs its diagram in 'images' (a list of images); found none.")
    # The math track's instruction, so answers are extracted and graded the same way (the last \boxed{}).
    problem = re.sub(r"\s*<image>\s*", " ", row["problem"]).strip()  # TRL places the image itself
    prompt = [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=problem)}]
    return {"prompt": prompt, "images": list(images), "solution": str(row["answer"])}


def load_geometry3k(split: str = "train", data_files: str | list[str] | None = None):
    """Geometry3K (``train`` / ``validation`` / ``test``) as prompt + images + solution.

    ``data_files``: local files in Geometry3K's schema, read instead of the Hub (``split`` is unused); use Parquet
    (e.g. ``Dataset.to_parquet``), which keeps the ``images`` feature.
    """
    if data_files is not None:
        dataset = load_local_files(data_files)
    else:
        dataset = load_dataset_isolated(GEOMETRY3K_ID, split=split)
    return dataset.map(geometry3k_to_riskpo, remove_columns=[c for c in dataset.column_names if c != "images"])
