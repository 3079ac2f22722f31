"""verl's loss granularity (token mean over 64-sequence micro-batches) through TRL's bnpo loss with
loss_token_mean_sequences: computed directly the way verl does and compared with what the trainer computes, on
batches of mixed completion lengths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config
from transformers import AutoModelForCausalLM, TrainerCallback

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.scripts import train
from riskpo_trl.trainer.token_mean import token_mean_group_scales

ROOT = Path(__file__).resolve().parents[1]
DAPO_RECIPE = ROOT / "recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo_authors/config_dapo_math.yaml"
VERL_MICRO_BATCH = 64  # the DAPO script's ppo_micro_batch_size_per_gpu


def mixed_lengths(count: int, max_length: int, generator: torch.Generator) -> torch.Tensor:
    """Completion lengths with about 30% truncated at max_length, the rest spread below it."""
    lengths = torch.randint(1, max_length, (count,), generator=generator)
    truncated = torch.rand(count, generator=generator) < 0.3
    return torch.where(truncated, torch.full_like(lengths, max_length), lengths)


def verl_step_loss(loss_sums: torch.Tensor, tokens: torch.Tensor, micro_batch: int) -> torch.Tensor:
    """verl's token-mean: one step's sequences in micro-batches of ``micro_batch``, each its summed loss over its
    token count, averaged over micro-batches (divided by the accumulation steps, averaged over ranks)."""
    chunks = [slice(i, i + micro_batch) for i in range(0, len(tokens), micro_batch)]
    return torch.stack([loss_sums[c].sum() / tokens[c].sum() for c in chunks]).mean()


def test_the_dapo_recipes_layout_gives_verls_token_mean_on_eight_processes():
    """The recipe's per_device_train_batch_size x 8 processes x gradient_accumulation_steps, each micro-batch's bnpo
    loss (its token mean / accumulation steps, averaged over processes) times its factor: verl's loss."""
    with pytest.warns(UserWarning, match="holds 160 sequences"):  # parsed on 1 process: 160 sequences per step
        _, args, _ = train.parse_args(["--config", str(DAPO_RECIPE), "--bf16", "false"])
    processes, per_device, accumulation = 8, args.per_device_train_batch_size, args.gradient_accumulation_steps
    steps_per_generation = args.steps_per_generation
    assert args.loss_type == "bnpo" and args.loss_token_mean_sequences == VERL_MICRO_BATCH
    generator = torch.Generator().manual_seed(0)
    # one generation batch: [process, micro-batch, sequence]
    shape = (processes, steps_per_generation, per_device)
    tokens = mixed_lengths(processes * steps_per_generation * per_device, args.max_completion_length, generator)
    tokens = tokens.reshape(shape).double()
    loss_sums = torch.randn(shape, generator=generator, dtype=torch.float64) * tokens  # per-token losses summed

    scales = token_mean_group_scales(tokens.sum(-1), accumulation, VERL_MICRO_BATCH // per_device)
    bnpo = loss_sums.sum(-1) / tokens.sum(-1) / accumulation  # TRL's bnpo, per micro-batch
    for step in range(steps_per_generation // accumulation):
        window = slice(step * accumulation, (step + 1) * accumulation)
        trl_step = (bnpo[:, window] * scales[:, window]).sum(-1).mean()  # accumulated, then averaged over processes
        plain_bnpo = bnpo[:, window].sum(-1).mean()
        # verl's micro-batches: the step's sequences in the order micro-step, process (any fixed order; TRL
        # shuffles the generation batch first)
        step_tokens, step_losses = (values[:, window].permute(1, 0, 2).reshape(-1) for values in (tokens, loss_sums))
        assert len(step_tokens) == 20 * VERL_MICRO_BATCH  # 20 micro-batches per optimizer step, as theirs
        verl = verl_step_loss(step_losses, step_tokens, VERL_MICRO_BATCH)
        assert trl_step.item() == pytest.approx(verl.item(), rel=1e-12)
        assert plain_bnpo.item() != pytest.approx(verl.item(), rel=1e-3)  # without the factors it differs


class GradientsBeforeEachStep(TrainerCallback):
    def __init__(self):
        self.steps: list[list[torch.Tensor]] = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append([p.grad.detach().clone() for p in model.parameters() if p.requires_grad])


# One process: 8 micro-batches of 16 per optimizer step, groups of 64 = 4 micro-batches, 2 groups per step.
SINGLE_LAYOUT = {"per_device": 16, "accumulation": 8, "steps_per_generation": 16, "token_mean_sequences": 64}
# Two processes (tests/scripts/distributed_token_mean.py): groups of 16 = micro-steps k and k + 1 of both processes.
DISTRIBUTED_LAYOUT = {"per_device": 4, "accumulation": 4, "steps_per_generation": 8, "token_mean_sequences": 16}


class MicroBatchesTheLossSees:
    """A forward pre-hook on the model (torch's public seam): each forward over rows of the made-up ``batch`` (prompt
    then completion ids) is recorded as those rows of ``batch``, in the order the loss takes them."""

    KEYS = ("prompt_ids", "completion_ids", "completion_mask", "advantages")

    def __init__(self, batch: dict[str, torch.Tensor]):
        self.batch, self.seen = batch, []

    def __call__(self, module, args, kwargs):
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        prompt_width, completion_ids = self.batch["prompt_ids"].shape[1], self.batch["completion_ids"]
        if input_ids is None or input_ids.shape[1] != prompt_width + completion_ids.shape[1]:
            return  # the real generation's forwards, before the batch is replaced
        matches = (input_ids[:, prompt_width:].unsqueeze(1) == completion_ids.unsqueeze(0)).all(-1)
        if matches.any(dim=1).all():
            rows = matches.float().argmax(dim=1)
            self.seen.append({key: self.batch[key][rows] for key in self.KEYS})


def train_on_a_made_up_batch(
    model_dir, output_dir, *, per_device, accumulation, steps_per_generation, token_mean_sequences
):
    """Two optimizer steps (learning rate 0) of TRL's real training loop on one generation batch of made-up
    completions of mixed lengths (different on each process), put in place of the generated one by a batch observer;
    returns the model, the gradients before each optimizer step, the micro-batches the loss saw, and the trainer."""
    args = tiny_config(
        output_dir,
        run=False,
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=8,
        bundle_size=1,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=steps_per_generation,
        max_steps=2,
        learning_rate=0.0,
        max_grad_norm=0.0,
        temperature=1.0,
        importance_sampling_level="token",
        loss_type="bnpo",
        delta=None,
        loss_token_mean_sequences=token_mean_sequences,
        save_strategy="no",
        logging_steps=1,
        max_completion_length=4,  # the generated batch is replaced: keep its generation short
    )
    trainer = RiskPOTrainer(
        model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset(num_prompts=64)
    )
    generator = torch.Generator().manual_seed(1 + trainer.accelerator.process_index)
    count, vocab, width = per_device * steps_per_generation, trainer.model.config.vocab_size, 12
    lengths = mixed_lengths(count, width, generator)
    completion_mask = (torch.arange(width) < lengths.unsqueeze(1)).long()
    batch = {
        "prompt_ids": torch.randint(4, vocab, (count, 4), generator=generator),  # same length: no left padding
        "prompt_mask": torch.ones(count, 4, dtype=torch.long),
        "completion_ids": torch.randint(4, vocab, (count, width), generator=generator),
        "completion_mask": completion_mask,
        "advantages": torch.randn(count, generator=generator),
        "num_items_in_batch": completion_mask.sum(),
    }

    def made_up(scored):  # the batch that goes to the loss: the made-up one, in place of the generated one
        scored.outputs.clear()
        scored.outputs.update(batch)

    trainer.add_batch_observer(made_up)
    recorder = MicroBatchesTheLossSees(batch)
    trainer.model.register_forward_pre_hook(recorder, with_kwargs=True)
    gradients = GradientsBeforeEachStep()
    trainer.add_callback(gradients)
    trainer.train()
    assert len(gradients.steps) == 2 and len(recorder.seen) == 2 * accumulation
    return trainer.model, gradients.steps, recorder.seen, trainer


def verl_gradients(model, micro_batches: list[dict], group_micro_batches: int) -> list[torch.Tensor]:
    """The gradient of verl's step loss (PPO at ratio 1: -A x ratio per token), the token mean over each group of
    consecutive micro-batches, averaged over groups."""
    losses = []
    for start in range(0, len(micro_batches), group_micro_batches):
        group = {
            key: torch.cat([mb[key] for mb in micro_batches[start : start + group_micro_batches]])
            for key in micro_batches[0]
        }
        input_ids = torch.cat([group["prompt_ids"], group["completion_ids"]], dim=1)
        width = group["completion_ids"].shape[1]
        logits = model(input_ids=input_ids).logits[:, -width - 1 : -1]
        logps = torch.log_softmax(logits.float(), -1).gather(-1, group["completion_ids"].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logps - logps.detach())
        mask = group["completion_mask"].float()
        losses.append((-group["advantages"].unsqueeze(1) * ratio * mask).sum() / mask.sum())
    return torch.autograd.grad(torch.stack(losses).mean(), [p for p in model.parameters() if p.requires_grad])


def relative_difference(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    flat = torch.cat([g.flatten() for g in ours]), torch.cat([g.flatten() for g in reference])
    return ((flat[0] - flat[1]).norm() / flat[1].norm()).item()


@pytest.mark.slow
def test_trl_training_loop_with_loss_token_mean_sequences_matches_verls_gradient(tiny_model_dir, tmp_path):
    model, steps, seen, _ = train_on_a_made_up_batch(tiny_model_dir, tmp_path / "groups", **SINGLE_LAYOUT)
    accumulation = SINGLE_LAYOUT["accumulation"]
    for step, gradient in enumerate(steps):
        reference = verl_gradients(model, seen[step * accumulation : (step + 1) * accumulation], 4)
        assert relative_difference(gradient, reference) < 1e-5, step
    # TRL's own bnpo (token mean per 16-sequence micro-batch) on the same data is measurably another loss
    plain = {**SINGLE_LAYOUT, "token_mean_sequences": None}
    model, steps, seen, _ = train_on_a_made_up_batch(tiny_model_dir, tmp_path / "plain", **plain)
    assert relative_difference(steps[0], verl_gradients(model, seen[:accumulation], 4)) > 1e-2


@pytest.mark.slow
@pytest.mark.distributed
def test_groups_spanning_two_processes_give_verls_gradient(tiny_model_dir, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes" / "accelerate_configs" / "cpu_2proc.yaml"),
        "--main_process_port",
        "0",  # a free port: other runs may hold the config's
        str(ROOT / "tests" / "scripts" / "distributed_token_mean.py"),
        str(tmp_path),
        tiny_model_dir,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1)]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)  # learning rate 0: the weights both ranks trained
    accumulation = DISTRIBUTED_LAYOUT["accumulation"]
    group = DISTRIBUTED_LAYOUT["token_mean_sequences"] // DISTRIBUTED_LAYOUT["per_device"]
    for step in range(2):
        assert relative_difference(ranks[0]["gradients"][step], ranks[1]["gradients"][step]) < 1e-6  # all-reduced
        # verl's micro-batches over the step's sequences in the order micro-step, then process
        window = range(step * accumulation, (step + 1) * accumulation)
        in_order = [rank["micro_batches"][k] for k in window for rank in ranks]
        reference = verl_gradients(model, in_order, group)
        assert relative_difference(ranks[0]["gradients"][step], reference) < 1e-5, step


def test_scales_weigh_every_group_alike_when_the_last_is_short():
    counts = torch.tensor([[10.0, 20.0, 30.0, 40.0], [5.0, 5.0, 5.0, 5.0]])  # 2 processes, 2 steps of 2 micro-steps
    # groups of 3 micro-batches: a step's 4 micro-batches are (10, 5, 20 | 5) and (30, 5, 40 | 5)
    scales = token_mean_group_scales(counts, gradient_accumulation_steps=2, micro_batches_per_group=3)
    assert torch.allclose(
        scales,
        torch.tensor(
            [[2 * 10 / 35, 2 * 20 / 35, 2 * 30 / 75, 2 * 40 / 75], [2 * 5 / 35, 2.0, 2 * 5 / 75, 2.0]],
            dtype=torch.float64,
        ),
    )
    assert torch.equal(token_mean_group_scales(counts, 2, 1), torch.ones_like(counts, dtype=torch.float64))
    assert torch.equal(token_mean_group_scales(torch.zeros(1, 2), 2, 2), torch.zeros(1, 2, dtype=torch.float64))


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"loss_type": "grpo"}, "regroups the token mean of loss_type='bnpo'"),
        ({"per_device_train_batch_size": 6}, "multiple of per_device_train_batch_size=6.*1, 2, 4, 8, 16, 32, 64"),
        ({"steps_per_generation": 12}, "steps_per_generation=12 must be a multiple of gradient_accumulation_steps=8"),
    ],
)
def test_loss_token_mean_sequences_is_checked_when_the_config_is_built(tmp_path, fields, error):
    base = {
        "output_dir": str(tmp_path),
        "loss_type": "bnpo",
        "loss_token_mean_sequences": 64,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 8,
        "steps_per_generation": 16,
        "num_generations": 8,
        "bundle_size": 1,
        "use_cpu": True,
        "save_strategy": "no",
    }
    with pytest.raises(ValueError, match=error):
        RiskPOConfig(**{**base, **fields})
    with pytest.warns(UserWarning, match="holds 32 sequences.*its last group holds 32"):
        RiskPOConfig(**{**base, "gradient_accumulation_steps": 4, "steps_per_generation": 16})
