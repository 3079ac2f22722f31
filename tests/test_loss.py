"""TRL's sequence-level GRPO loss is the paper's clipped MVaR objective (eq. mvar_obj), checked directly."""

from __future__ import annotations

import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset

from riskpo_trl import RiskPOConfig, RiskPOTrainer


def completion_logps(model, inputs, temperature: float) -> torch.Tensor:
    """log pi(token) of every completion token, at the sampling temperature."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention).logits / temperature
    completion_len = inputs["completion_ids"].shape[1]
    logits = logits[:, -completion_len - 1 : -1]  # position t predicts token t + 1
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)


def paper_objective(model, inputs, temperature: float, epsilon: float) -> tuple[torch.Tensor, float]:
    """J = mean_{j,i} min(s A, clip(s, 1-eps, 1+eps) A), s = (pi / pi_old)^(1/|y|), written from the paper; and the
    share of sequences on the clipped branch (where the clipped term is the smaller)."""
    logps = completion_logps(model, inputs, temperature)
    mask = inputs["completion_mask"].float()
    lengths = mask.sum(-1)
    log_seq_ratio = ((logps - inputs["old_per_token_logps"]) * mask).sum(-1)
    s = torch.exp(log_seq_ratio / lengths)
    advantages = inputs["advantages"]
    unclipped, clipped = s * advantages, s.clamp(1 - epsilon, 1 + epsilon) * advantages
    return torch.minimum(unclipped, clipped).mean(), (clipped < unclipped).float().mean().item()


def loss_against_paper(trainer) -> dict:
    """TRL's loss and gradients on a fixed batch (built on the model's device) against :func:`paper_objective`'s,
    with the tolerances this file holds them to; ``clipped`` is the share of sequences on the clipped branch."""
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    torch.manual_seed(0)
    batch, prompt_len, completion_len = 6, 5, 7
    vocab = model.config.vocab_size
    completion_mask = torch.ones(batch, completion_len, dtype=torch.long)
    completion_mask[1, 4:] = 0  # completions of different lengths
    completion_mask[3, 2:] = 0
    inputs = {
        "prompt_ids": torch.randint(4, vocab, (batch, prompt_len)),
        "prompt_mask": torch.ones(batch, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(4, vocab, (batch, completion_len)),
        "completion_mask": completion_mask,
        "advantages": torch.tensor([-1.5, -0.2, 0.0, -3.0, 0.7, -0.9]),
        "num_items_in_batch": completion_mask.sum(),
    }
    inputs = {key: value.to(model.device) for key, value in inputs.items()}
    with torch.no_grad():
        reference_logps = completion_logps(model, inputs, trainer.args.temperature)
    # pi_old shifted per sequence (plus token noise) so that sequence ratios fall on both sides of [0.8, 1.2]:
    # rows 0 and 3 (A < 0, s < 0.8) and row 4 (A > 0, s > 1.2) take the clipped branch, row 1 (A < 0, s > 1.2) not.
    offsets = torch.tensor([0.5, -0.5, 0.1, 0.4, -0.4, 0.0], device=model.device).unsqueeze(1)
    noise = 0.05 * torch.randn(reference_logps.shape).to(model.device)
    inputs["old_per_token_logps"] = reference_logps + offsets + noise

    trl_loss = trainer.compute_loss(model, inputs)  # the Trainer's public loss, which TRL's GRPO loss implements
    trl_grads = torch.autograd.grad(trl_loss, [p for p in model.parameters() if p.requires_grad])
    objective, clipped = paper_objective(model, inputs, trainer.args.temperature, trainer.args.epsilon)
    ours = -objective
    our_grads = torch.autograd.grad(ours, [p for p in model.parameters() if p.requires_grad])
    return {
        "trl_loss": trl_loss.item(),
        "paper_loss": ours.item(),
        "loss_matches": trl_loss.item() == pytest.approx(ours.item(), rel=1e-5, abs=1e-6),
        "max_grad_difference": max((a - b).abs().max().item() for a, b in zip(trl_grads, our_grads)),
        "grads_match": all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(trl_grads, our_grads)),
        "clipped": clipped,
    }


def test_trl_sequence_level_grpo_loss_is_the_papers_objective(tiny_model_dir, tmp_path):
    args = RiskPOConfig(
        output_dir=str(tmp_path), report_to="none", gradient_checkpointing=False, max_completion_length=8
    )
    trainer = RiskPOTrainer(
        tiny_model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset()
    )
    result = loss_against_paper(trainer)
    assert result["loss_matches"], result
    assert result["grads_match"], result
    assert result["clipped"] > 0  # the comparison exercised the clipped branch, not only the unclipped one
