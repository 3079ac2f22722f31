"""Colocate mode for real: RiskPOTrainer generates with a vLLM engine in its own process and pushes its weights in.

TRL's colocate engine takes vLLM's default dtype, which is bfloat16 on CPU. vLLM's CPU linear layers keep plain
weights there only where oneDNN has no bfloat16 matmul (CPUs without AVX512-BF16 or AMX): elsewhere, and in float32
on any CPU, vLLM packs the weights for oneDNN and drops the parameters, and TRL's weight sync fails with
"'Parameter' object has no attribute 'weight_loader'" (docs/scale_out.md).
"""

from __future__ import annotations

import os

import pytest
import torch
from helpers import contains_digit_reward, make_prompt_dataset, release_in_process_vllm

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model

pytestmark = pytest.mark.vllm_real

PACKS_BF16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


@pytest.fixture
def plain_process_after():
    """TRL's colocate engine sets RANK, WORLD_SIZE, MASTER_ADDR, ... in os.environ and opens a process group; later
    tests (and their subprocesses) must not inherit them."""
    environ = dict(os.environ)
    yield
    release_in_process_vllm()
    os.environ.clear()
    os.environ.update(environ)


def vllm_model(trainer):
    # Where TRL's sync_weights loads the weights (colocate mode).
    return trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model


def vllm_qkv(trainer, layer: int = 0) -> torch.Tensor:
    return vllm_model(trainer).model.layers[layer].self_attn.qkv_proj.weight.detach().clone()


def trained_qkv(trainer, layer: int = 0) -> torch.Tensor:
    attention = trainer.model.model.layers[layer].self_attn
    return torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]).detach()


@pytest.mark.skipif(
    PACKS_BF16,
    reason="vLLM packs bfloat16 weights for oneDNN on this CPU (AVX512-BF16/AMX), so "
    "TRL's colocate weight sync fails there (docs/scale_out.md)",
)
def test_colocate_training_pushes_each_step_s_weights_into_vllm(tmp_path, plain_process_after):
    model_dir = tmp_path / "tiny"
    build_tiny_model(model_dir, **VLLM_CPU_SIZES)
    args = RiskPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        bundle_size=2,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        max_completion_length=16,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=7,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=128,
    )
    trainer = RiskPOTrainer(
        str(model_dir), reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset()
    )
    initial = vllm_qkv(trainer)
    assert initial.dtype == torch.bfloat16 and initial.numel() > 0  # vLLM's default dtype on CPU, plain weights
    torch.testing.assert_close(initial, trained_qkv(trainer).to(torch.bfloat16), rtol=0, atol=0)

    trainer.train()  # the second generation batch syncs the weights of step 1 into vLLM
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all("risk/mvar" in entry for entry in logs)
    assert not torch.equal(vllm_qkv(trainer), initial)

    trainer.vllm_generation.sync_weights()  # the same call, after the last step: vLLM now holds those weights
    torch.testing.assert_close(vllm_qkv(trainer), trained_qkv(trainer).to(torch.bfloat16), rtol=0, atol=0)
