"""Vision-language RiskPO: Geometry3K adapter and reward, and a few training steps of a tiny local VLM with images."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from datasets import Dataset
from helpers import geometry3k_rows

from riskpo_trl import RiskPOConfig, RiskPOTrainer, job
from riskpo_trl.data import PROMPT_TEMPLATE as MATH_PROMPT_TEMPLATE
from riskpo_trl.multimodal import build_tiny_vlm, geometry3k_to_riskpo, geometry_accuracy_reward


def test_geometry3k_adapter_moves_the_image_out_of_the_text():
    row = geometry3k_to_riskpo(geometry3k_rows(1)[0])
    assert row["solution"] == "0" and len(row["images"]) == 1
    content = row["prompt"][0]["content"]
    assert "<image>" not in content and content.startswith("Find x") and "\\boxed{}" in content
    with pytest.raises(ValueError, match="images"):
        geometry3k_to_riskpo({"problem": "x", "answer": "1", "images": []})


def test_geometry_reward_uses_math_verify_on_the_last_box():
    completions = ["so x = \\boxed{\\frac{1}{2}}", "\\boxed{3} no wait \\boxed{4}", "no box", "\\boxed{0.5}"]
    assert geometry_accuracy_reward(completions, ["0.5", "3", "3", ""]) == [1.0, 0.0, 0.0, None]


def test_geometry_reward_shares_the_math_grader():
    """\\fbox answers count, an unparseable gold is unscorable (None), and worker threads (no signal timeouts) work."""
    completions = ["the answer is \\fbox{12}", "\\boxed{3}", [{"role": "assistant", "content": "\\boxed{2\\sqrt{3}}"}]]
    solution = ["12", "???", "2\\sqrt{3}"]
    assert geometry_accuracy_reward(completions, solution) == [1.0, None, 1.0]
    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(geometry_accuracy_reward, completions, solution).result() == [1.0, None, 1.0]


def test_geometry_prompt_matches_the_math_track():
    row = geometry3k_to_riskpo(geometry3k_rows(1)[0])
    problem = re.sub(r"\s*<image>\s*", " ", geometry3k_rows(1)[0]["problem"]).strip()
    assert row["prompt"][0]["content"] == MATH_PROMPT_TEMPLATE.format(problem=problem)


@pytest.mark.slow
def test_tiny_vlm_trains_riskpo_steps_with_images(tmp_path):
    model_dir = tmp_path / "tiny-vlm"
    build_tiny_vlm(model_dir)
    dataset = Dataset.from_list([geometry3k_to_riskpo(r) for r in geometry3k_rows(10)])

    def has_digit(completions, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [float(any(ch.isdigit() for ch in t)) for t in texts]

    args = RiskPOConfig(
        output_dir=str(tmp_path / "out"),
        num_generations=2,
        bundle_size=5,
        per_device_train_batch_size=10,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        # The random VLM often scores every bundle alike; the paper's advantage still pushes every completion then,
        # where the leave-one-out baseline rightly gives 0, and this test is about the images reaching the gradient.
        advantage_baseline="none",
    )
    # Through the job layer, as riskpo-train builds it: before TRL 1.16 it keeps generation from sampling the image token.
    trainer = job.build(
        RiskPOTrainer,
        model=str(model_dir),
        reward_funcs=[has_digit, geometry_accuracy_reward],
        args=args,
        train_dataset=dataset,
    )
    batches = []
    trainer.add_batch_observer(lambda scored: batches.append(scored.risk))
    assert type(trainer.processing_class).__name__ == "LlavaProcessor"  # TRL's vision-language path
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "risk/q_alpha" in entry]
    assert len(logs) == 2
    assert len(batches) == 2 and all(batch.advantages.numel() == 10 for batch in batches)
    changed = [n for n, p in trainer.model.named_parameters() if not torch_equal(p, before[n])]
    assert any("vision" in n or "multi_modal_projector" in n for n in changed), "images never reached the gradient"
    assert any("language_model" in n for n in changed)


def torch_equal(a, b) -> bool:
    return bool((a.detach() == b).all())
