"""Exact evaluation: each problem's success probability under the sampling policy, by teacher forcing, no sampling.

The exact protocol's grader (:class:`~benchmarks.lm_study.task.StrictExactMatch`) accepts exactly one completion per
problem: the sum's digit tokens followed by EOS. So the probability that one sampled completion is accepted is the
product, over those tokens, of the temperature-scaled next-token probabilities, and Pass@k of a problem is
``1 - (1 - p)^k`` for every ``k``, exact, with no sampling noise. (The old text grader also accepted whitespace
around the digits, special tokens that decoding skips, and a completion cut at the length limit without EOS: a set of
up to ~35,000 token prefixes per problem to teacher-force, too many to evaluate every run; the strict grader makes
the accepted set one sequence.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .evaluation import sampling_aside
from .task import Problem, prompt_of


def accepted_completion_ids(tokenizer, target: str) -> list[int]:
    """The one completion the strict grader accepts for ``target``: its tokens, then EOS."""
    return [*tokenizer(target, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]


@torch.no_grad()
def success_probabilities(
    model,
    tokenizer,
    prompts: Sequence[str],
    targets: Sequence[str],
    *,
    temperature: float,
    max_completion_length: int,
    batch_size: int = 256,
) -> list[float]:
    """``p_i`` = the probability that one completion sampled for ``prompts[i]`` (softmax of the logits divided by
    ``temperature`` over the whole vocabulary, at most ``max_completion_length`` tokens) is exactly
    ``accepted_completion_ids(targets[i])``; 0 when that sequence is longer than the limit. Computed in float64 from
    the model's logits, one teacher-forced forward pass per batch (right padding: causal attention keeps every scored
    position independent of it)."""
    was_training = model.training
    model.eval()
    try:
        out: list[float] = []
        for start in range(0, len(prompts), batch_size):
            rows = []
            for prompt, target in zip(prompts[start : start + batch_size], targets[start : start + batch_size]):
                prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
                rows.append((prompt_ids, accepted_completion_ids(tokenizer, target)))
            width = max(len(p) + len(c) for p, c in rows)
            ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, (p, c) in enumerate(rows):
                ids[i, : len(p) + len(c)] = torch.tensor(p + c)
                mask[i, : len(p) + len(c)] = 1
            logits = model(input_ids=ids, attention_mask=mask).logits.double() / temperature
            logp = torch.log_softmax(logits, dim=-1)
            for i, (p, c) in enumerate(rows):
                if len(c) > max_completion_length:
                    out.append(0.0)
                    continue
                positions = torch.arange(len(p) - 1, len(p) + len(c) - 1)
                out.append(math.exp(float(logp[i, positions, torch.tensor(c)].sum())))
        return out
    finally:
        model.train(was_training)


def problem_probabilities(
    model, tokenizer, problems: dict[int, list[Problem]], *, temperature: float, max_completion_length: int
) -> dict[str, list[float]]:
    """Per bucket (``"<d>digit"``), each problem's exact success probability, in split order."""
    return {
        f"{d}digit": success_probabilities(
            model,
            tokenizer,
            [prompt_of(a, b) for a, b in pairs],
            [str(a + b) for a, b in pairs],
            temperature=temperature,
            max_completion_length=max_completion_length,
        )
        for d, pairs in problems.items()
    }


def probs_matrix(entries: list[dict[str, list[float]]], buckets: list[str], bucket: str | None = None) -> np.ndarray:
    """(seeds, problems) exact success probabilities, buckets concatenated in order (or one bucket)."""
    chosen = [bucket] if bucket else buckets
    return np.array([[p for b in chosen for p in entry[b]] for entry in entries], dtype=np.float64)


def pass_at_k(p: np.ndarray | Sequence[float], k: int | np.ndarray) -> np.ndarray:
    """Exact Pass@k = 1 - (1 - p)^k, elementwise, computed as ``-expm1(k log1p(-p))`` (accurate for tiny p)."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return -np.expm1(np.asarray(k, dtype=np.float64) * np.log1p(-p))


def pass_at_k_curve(p: Sequence[float], ks: Sequence[int]) -> dict[str, float]:
    """Mean exact Pass@k over problems, for each ``k``."""
    return {f"pass@{k}": float(pass_at_k(p, k).mean()) for k in ks}


@torch.no_grad()
def sampled_acceptances(
    model,
    tokenizer,
    prompts: Sequence[str],
    targets: Sequence[str],
    *,
    num_samples: int,
    temperature: float,
    max_completion_length: int,
    seed: int,
) -> dict[str, list[int]]:
    """The sampling check: for each prompt, how many of ``num_samples`` completions sampled as in training (no top-k,
    no top-p) the strict grader accepts, and how many the old text grader accepts. The global random state is
    restored afterwards."""
    from .task import StrictExactMatch, exact_match_reward

    strict = StrictExactMatch(tokenizer)
    counts: dict[str, list[int]] = {"strict": [], "text": []}
    with sampling_aside(model, tokenizer, seed):
        for prompt, target in zip(prompts, targets):
            enc = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
            gen = model.generate(
                **enc,
                do_sample=True,
                temperature=temperature,
                top_k=None,
                top_p=1.0,
                max_new_tokens=max_completion_length,
                num_return_sequences=num_samples,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :].tolist()
            ids = [
                row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row for row in new
            ]
            texts = tokenizer.batch_decode(new, skip_special_tokens=True)
            counts["strict"].append(int(sum(strict([""] * num_samples, [target] * num_samples, completion_ids=ids))))
            counts["text"].append(int(sum(exact_match_reward(texts, [target] * num_samples))))
    return counts
