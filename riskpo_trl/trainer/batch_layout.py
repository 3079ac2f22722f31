"""RiskPO's batch-layout arithmetic, in plain Python: whether a generation batch's prompts form whole bundle groups.

``RiskPOConfig`` checks it when it is built, and ``riskpo-train`` before torch and TRL load
(riskpo_trl.scripts.early_checks), with this one message.
"""

from __future__ import annotations


def bundle_layout_error(generation_batch_size: int, num_generations: int, bundle_size: int) -> str | None:
    """Why a generation batch of ``generation_batch_size`` completions does not cut into bundle groups of
    ``bundle_size`` prompts of ``num_generations`` completions each, with the fixes; None when it does."""
    prompts = generation_batch_size // num_generations
    if prompts % bundle_size == 0:
        return None
    return (
        f"A generation batch holds {prompts} prompts (generation_batch_size={generation_batch_size} / "
        f"num_generations={num_generations}), which is not a multiple of bundle_size={bundle_size}. "
        f"Make generation_batch_size a multiple of num_generations * bundle_size = "
        f"{num_generations * bundle_size} ({multiples(num_generations * bundle_size)}), "
        "e.g. through per_device_train_batch_size x num_processes x steps_per_generation, or choose a "
        f"bundle_size that divides {prompts} ({divisors(prompts)})."
    )


def multiples(step: int, count: int = 3) -> str:
    return ", ".join(str(step * k) for k in range(1, count + 1)) + ", ..."


def divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
