"""Pass@k of a policy on a split, per difficulty bucket, and the learning-rate selection score."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from riskpo_trl.evaluation.metrics import mean_pass_at_k

from .config import LMConfig
from .task import Problem, prompt_of


def evaluate(model, tokenizer, problems: dict[int, list[Problem]], cfg: LMConfig) -> dict[str, Any]:
    """Pass@k per bucket and overall from ``eval_samples`` completions per problem, sampled with the library's
    ``TransformersBackend`` at the training temperature; Pass@k through ``riskpo_trl.evaluation.metrics``."""
    from riskpo_trl.evaluation.generation import SamplingSettings, TransformersBackend

    model.generation_config.top_k = None  # plain temperature sampling over the whole vocabulary, as in training
    backend = TransformersBackend(model, tokenizer, batch_size=64)
    settings = SamplingSettings(
        num_samples=cfg.eval_samples, temperature=cfg.temperature, top_p=1.0, max_new_tokens=cfg.max_completion_length
    )
    torch.manual_seed(cfg.eval_seed)
    out: dict[str, Any] = {}
    all_counts: list[int] = []
    for d, pairs in problems.items():
        samples = backend.generate([prompt_of(a, b) for a, b in pairs], settings)
        counts = [sum(s.text.strip() == str(a + b) for s in group) for (a, b), group in zip(pairs, samples)]
        all_counts += counts
        out[f"{d}digit"] = pass_at_ks(counts, cfg)
    out["all"] = pass_at_ks(all_counts, cfg)
    return out


def pass_at_ks(counts: list[int], cfg: LMConfig) -> dict[str, float]:
    return {f"pass@{k}": mean_pass_at_k([cfg.eval_samples] * len(counts), counts, k) for k in cfg.ks}


def selection_score(val: dict[str, Any], cfg: LMConfig) -> float:
    """The fixed lr-selection criterion (``SELECTION_CRITERION``)."""
    return (val["all"]["pass@1"] + val["all"][f"pass@{cfg.ks[-1]}"]) / 2


@contextmanager
def sampling_aside(model, tokenizer, seed: int) -> Iterator[None]:
    """Sample in eval mode with left padding, from the torch random state seeded with ``seed``; the model's mode, the
    tokenizer's padding side and the global random state are restored afterwards, so that an evaluation in the middle
    of a run does not change what the run samples next."""
    was_training = model.training
    model.eval()
    padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)


@torch.no_grad()
def evaluate_tracked(
    model,
    tokenizer,
    problems: dict[int, list[Problem]],
    *,
    num_samples: int,
    ks: tuple[int, ...],
    temperature: float,
    max_new_tokens: int,
    seed: int,
    batch_prompts: int = 50,
) -> dict[str, Any]:
    """Pass@k per bucket and overall, the sampling policy's token entropy per bucket, and each problem's number of
    correct samples, from ``num_samples`` completions per problem at ``temperature`` (the training sampler: no top-k,
    no top-p).

    The entropy is that of the temperature-scaled next-token distribution at every sampled position up to and including
    EOS, averaged over those tokens (the quantity TRL logs as ``entropy`` on training batches). The global random state
    is restored afterwards, so an evaluation in the middle of a run does not change what the run samples next."""
    model.generation_config.top_k = None  # plain temperature sampling over the whole vocabulary, as in training
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    out: dict[str, Any] = {}
    all_counts: list[int] = []
    total_entropy = total_tokens = 0.0
    with sampling_aside(model, tokenizer, seed):
        for d, pairs in problems.items():
            counts: list[int] = []
            bucket_entropy = bucket_tokens = 0.0
            for start in range(0, len(pairs), batch_prompts):
                chunk = pairs[start : start + batch_prompts]
                enc = tokenizer(
                    [prompt_of(a, b) for a, b in chunk],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=False,
                )
                gen = model.generate(
                    **enc,
                    do_sample=True,
                    temperature=temperature,
                    top_k=None,
                    top_p=1.0,
                    max_new_tokens=max_new_tokens,
                    num_return_sequences=num_samples,
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=pad,
                    eos_token_id=eos,
                )
                new = gen.sequences[:, enc["input_ids"].shape[1] :]
                # A position counts until (and including) the first EOS.
                ended_before = torch.cumsum((new == eos).long(), dim=1) - (new == eos).long() > 0
                live = ~ended_before
                logp = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in gen.scores], dim=1)
                entropy = -(logp.exp() * logp.nan_to_num(0.0, neginf=0.0)).sum(-1)
                bucket_entropy += float((entropy * live).sum())
                bucket_tokens += float(live.sum())
                texts = tokenizer.batch_decode(new, skip_special_tokens=True)
                for i, (a, b) in enumerate(chunk):
                    group = texts[i * num_samples : (i + 1) * num_samples]
                    counts.append(sum(t.strip() == str(a + b) for t in group))
            out[f"{d}digit"] = {
                **counts_to_pass_at_ks(counts, num_samples, ks),
                "entropy": bucket_entropy / max(bucket_tokens, 1.0),
                "counts": counts,
            }
            all_counts += counts
            total_entropy += bucket_entropy
            total_tokens += bucket_tokens
    out["all"] = {
        **counts_to_pass_at_ks(all_counts, num_samples, ks),
        "entropy": total_entropy / max(total_tokens, 1.0),
    }
    return out


def counts_to_pass_at_ks(counts: list[int], num_samples: int, ks: tuple[int, ...]) -> dict[str, float]:
    """Unbiased Pass@k for each ``k <= num_samples`` from per-problem correct counts."""
    return {f"pass@{k}": mean_pass_at_k([num_samples] * len(counts), counts, k) for k in ks if k <= num_samples}
