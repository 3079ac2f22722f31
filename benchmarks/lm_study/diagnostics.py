"""Gradient diagnostics at the SFT start: each method's advantage on the same sampled batches, its gradient's
signal-to-noise ratio and direction."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from .config import AUTHORS_FIELDS, LMConfig
from .task import make_splits, prompt_of


def advantage_for(method: str, rewards: torch.Tensor, cfg: LMConfig, tracker, generator) -> torch.Tensor:
    """Each method's advantage on one generation batch, through the library's code (GRPO: TRL's group formula)."""
    from riskpo_trl.risk import group_quantiles, permutation_bundles, riskpo_advantages

    g = cfg.num_generations
    if method in ("grpo", "gspo"):
        grouped = rewards.view(-1, g)
        return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
    bundles = permutation_bundles(rewards, g, cfg.bundle_size, generator)
    levels = (0.2, 0.8)
    extra: dict[str, Any] = {"advantage_baseline": "loo" if method == "riskpo_loo" else "none"}
    if method == "riskpo_authors":
        q_alpha, q_beta = group_quantiles(bundles[0], g, list(levels)).unbind(dim=1)
        extra.update({k: v for k, v in AUTHORS_FIELDS.items() if k not in ("quantile_source", "risk_omega")})
        extra["levels"] = levels
        omega, profile = AUTHORS_FIELDS["risk_omega"], "mvar"
    else:
        q_alpha, q_beta = tracker.update(bundles[0]).tolist()
        omega, profile = 0.5, ("risk_seeking" if method == "risk_seeking" else "mvar")
    return riskpo_advantages(
        rewards,
        num_generations=g,
        bundle_size=cfg.bundle_size,
        q_alpha=q_alpha,
        q_beta=q_beta,
        omega=omega,
        risk_profile=profile,
        bundles=bundles,
        **extra,
    ).advantages


def _answer_loglik_gradient(model, tokenizer, batch, params, temperature: float) -> torch.Tensor:
    """Gradient of the mean length-normalised log-likelihood of the correct answers (with EOS) to ``batch``'s
    prompts, at the sampling temperature: the direction in which every right answer becomes likelier."""
    seqs, prompt_lens = [], []
    for _, a, b in batch:
        prompt_ids = tokenizer(prompt_of(a, b), add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(str(a + b), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(prompt_ids + answer_ids)
        prompt_lens.append(len(prompt_ids))
    width = max(len(x) for x in seqs)
    input_ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in seqs])
    attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])
    logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / temperature
    token_logp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    action = (torch.arange(1, width).unsqueeze(0) >= torch.tensor(prompt_lens).unsqueeze(1)) & (attention[:, 1:] == 1)
    loglik = ((token_logp * action).sum(1) / action.sum(1)).mean()
    return torch.cat([x.reshape(-1) for x in torch.autograd.grad(loglik, params)])


def gradient_diagnostics(cfg: LMConfig, out_dir: Path, methods: list[str], num_batches: int = 32) -> dict[str, Any]:
    """At the SFT start, on the *same* sampled generation batches for every method (paired): the signal-to-noise
    ratio of the batch policy gradient (sequence-level score function, length-normalised log-prob, as GSPO/RiskPO's
    loss at ratio 1), the cosine of each method's mean gradient with GRPO's and with the gradient of the log-likelihood
    of the correct answers to the same prompts (the direction that makes right answers likelier; a negative cosine
    means the update makes them less likely), the fraction of completions with a positive advantage and with a
    negative one, and the share of total |advantage| that lands on each difficulty bucket. Cached in
    ``gradient_diagnostics.json``."""
    path = out_dir / "gradient_diagnostics.json"
    if path.exists():
        return json.loads(path.read_text())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from riskpo_trl.evaluation.generation import SamplingSettings, TransformersBackend
    from riskpo_trl.risk.quantile_tracker import QuantileTracker

    sft_dir = out_dir / "models" / "sft"
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    model = AutoModelForCausalLM.from_pretrained(sft_dir)
    model.generation_config.top_k = None
    backend = TransformersBackend(model, tokenizer, batch_size=64)
    settings = SamplingSettings(
        num_samples=cfg.num_generations,
        temperature=cfg.temperature,
        top_p=1.0,
        max_new_tokens=cfg.max_completion_length,
    )
    splits = make_splits(cfg)
    pool = [(d, a, b) for d, pairs in splits.train.items() for a, b in pairs]
    rng = random.Random(99)
    torch.manual_seed(99)
    trackers = {m: QuantileTracker((0.2, 0.8), lr=0.1) for m in methods}
    generators = {m: torch.Generator().manual_seed(7) for m in methods}
    grads: dict[str, list[torch.Tensor]] = {m: [] for m in methods}
    truth_grads: list[torch.Tensor] = []
    signs = {m: {"positive": 0, "negative": 0, "total": 0} for m in methods}
    mass = {m: {f"{d}digit": 0.0 for d in cfg.digits} for m in methods}
    params = [p for p in model.parameters() if p.requires_grad]
    eos = tokenizer.eos_token_id
    for _ in range(num_batches):
        batch = rng.sample(pool, cfg.prompts_per_generation)
        prompts = [prompt_of(a, b) for _, a, b in batch]
        samples = backend.generate(prompts, settings)
        rewards, seqs, prompt_lens, buckets = [], [], [], []
        for (d, a, b), prompt, group in zip(batch, prompts, samples):
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            for sample in group:
                ids = tokenizer(sample.text, add_special_tokens=False)["input_ids"]
                if sample.num_tokens > len(ids):  # the completion ended with EOS: it is part of the action
                    ids = ids + [eos]
                seqs.append(prompt_ids + ids)
                prompt_lens.append(len(prompt_ids))
                rewards.append(float(sample.text.strip() == str(a + b)))
                buckets.append(f"{d}digit")
        width = max(len(x) for x in seqs)
        input_ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in seqs])
        attention = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in seqs])
        model.train()
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1].float() / cfg.temperature
        token_logp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        positions = torch.arange(1, width).unsqueeze(0)
        action = (positions >= torch.tensor(prompt_lens).unsqueeze(1)) & (attention[:, 1:] == 1)
        seq_logp = (token_logp * action).sum(1) / action.sum(1).clamp(min=1)
        reward_t = torch.tensor(rewards)
        truth_grads.append(_answer_loglik_gradient(model, tokenizer, batch, params, cfg.temperature))
        for m in methods:
            adv = advantage_for(m, reward_t, cfg, trackers[m], generators[m]).float()
            # A tolerance: the paper's MVaR formula cancels to ~1e-17, not exactly 0, above q_beta.
            signs[m]["positive"] += int((adv > 1e-6).sum())
            signs[m]["negative"] += int((adv < -1e-6).sum())
            signs[m]["total"] += adv.numel()
            for bucket, value in zip(buckets, adv.abs().tolist()):
                mass[m][bucket] += value
            grad = torch.autograd.grad((adv * seq_logp).mean(), params, retain_graph=True)
            grads[m].append(torch.cat([x.reshape(-1) for x in grad]))
    out: dict[str, Any] = {"num_batches": num_batches, "methods": {}}
    grpo_mean = torch.stack(grads["grpo"]).mean(0) if "grpo" in grads else None
    truth = torch.stack(truth_grads).mean(0)
    for m in methods:
        g = torch.stack(grads[m])
        mean = g.mean(0)
        noise = (g - mean).pow(2).sum(1).mean()
        total = sum(mass[m].values()) or 1.0
        out["methods"][m] = {
            "snr": (mean.pow(2).sum() / noise.clamp(min=1e-30)).item(),
            "cosine_of_mean_gradient_with_grpo": (
                torch.nn.functional.cosine_similarity(mean, grpo_mean, dim=0).item() if grpo_mean is not None else None
            ),
            "cosine_of_mean_gradient_with_answer_loglik": torch.nn.functional.cosine_similarity(
                mean, truth, dim=0
            ).item(),
            "mean_batch_cosine_with_answer_loglik": torch.nn.functional.cosine_similarity(
                g, torch.stack(truth_grads), dim=1
            )
            .nan_to_num(0.0)
            .mean()
            .item(),
            "fraction_positive_advantage": signs[m]["positive"] / max(1, signs[m]["total"]),
            "fraction_negative_advantage": signs[m]["negative"] / max(1, signs[m]["total"]),
            "abs_advantage_share_by_bucket": {b: v / total for b, v in mass[m].items()},
        }
    path.write_text(json.dumps(out, indent=2) + "\n")
    return out
