"""What only a CUDA GPU can show: the risk math and a training step on the GPU agree with the CPU. Marked ``gpu`` and
skipped without CUDA; ``benchmarks.gpu_check`` runs the same checks with figures (docs/benchmarks.md, section 5)."""

from __future__ import annotations

import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset

from benchmarks import gpu_check
from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.risk import QUANTILE_SOURCES, RiskEstimator
from riskpo_trl.weight_sync.checksums import checksum, same_checksum

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("source", list(QUANTILE_SOURCES))
def test_every_quantile_source_gives_the_cpu_advantages_on_cuda(source):
    # The authors' per-group quantiles once built their levels on the CPU, which torch refuses for CUDA scores.
    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0] * 5)
    results = []
    for device in ("cpu", "cuda"):
        estimator = RiskEstimator(
            num_generations=8, bundle_size=5, alpha=0.2, beta=0.8, omega=0.5, quantile_source=source
        )
        batch = estimator.step(rewards.to(device), generator=torch.Generator().manual_seed(0), train=True)
        assert batch.advantages.device.type == device
        results.append(batch.advantages.cpu())
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=1e-6)


def test_every_estimator_combination_agrees_with_the_cpu_on_cuda():
    result = gpu_check.check_risk_math("cuda")
    assert result["ok"], result["mismatches"]
    assert result["batches_compared"] == 4 * result["combinations"] > 100


@pytest.mark.parametrize("quantile_source", ["tracked", "group"])
def test_a_training_step_on_cuda_gives_finite_advantages(tmp_path, tiny_model_dir, quantile_source):
    args = RiskPOConfig(
        output_dir=str(tmp_path),
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        bundle_size=2,
        max_completion_length=8,
        max_steps=1,
        quantile_source=quantile_source,
        bf16=torch.cuda.is_bf16_supported(),
        report_to="none",
        save_strategy="no",
    )
    trainer = RiskPOTrainer(
        tiny_model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset()
    )
    seen = []
    trainer.add_batch_observer(seen.append)
    trainer.train()
    assert trainer.model.device.type == "cuda" and trainer.state.global_step == 1
    [scored] = [batch for batch in seen if batch.mode == "train"]
    advantages = scored.outputs["advantages"]
    assert advantages.device.type == "cuda" and torch.isfinite(advantages).all()


def test_a_weight_checksum_on_cuda_matches_the_one_on_cpu():
    tensor = torch.randn(257, 33, generator=torch.Generator().manual_seed(0))
    assert same_checksum(checksum(tensor.cuda()), checksum(tensor))
