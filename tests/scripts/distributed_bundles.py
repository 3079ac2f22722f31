"""Run by tests/test_distributed.py under `accelerate launch`: a few RiskPO steps, every rank dumps its view of
each generation batch (full bundle ids and advantages, its own slice, tracker values) to JSON.

    distributed_bundles.py OUTPUT_DIR MODEL_DIR [--resume CHECKPOINT] [--advantage-baseline NAME]

Checkpoints are saved every 2 steps; with --resume the run continues from CHECKPOINT instead of starting fresh.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from riskpo_trl import RiskPOConfig, RiskPOTrainer

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import contains_digit_reward, make_prompt_dataset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("model_dir")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--advantage-baseline", default="none")
    cli = parser.parse_args()
    args = RiskPOConfig(
        output_dir=cli.output_dir,
        max_steps=3,
        max_completion_length=12,
        per_device_train_batch_size=10,
        gradient_accumulation_steps=5,
        steps_per_generation=5,
        logging_steps=1,
        report_to="none",
        save_strategy="steps",
        save_steps=2,
        gradient_checkpointing=False,
        learning_rate=1e-3,
        seed=11,
        advantage_baseline=cli.advantage_baseline,
    )
    trainer = RiskPOTrainer(
        cli.model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset(num_prompts=20)
    )
    records = []

    def record(scored):
        if scored.mode != "train":
            return
        batch, output = scored.risk, scored.outputs
        records.append(
            {
                "step": trainer.state.global_step + 1,
                "bundle_ids": batch.bundle_ids.tolist(),
                "advantages": batch.advantages.tolist(),
                "local_advantages": output["advantages"].cpu().tolist(),
                "tracker": trainer.quantile_tracker.values.tolist(),
                "world_size": trainer.accelerator.num_processes,
            }
        )

    trainer.add_batch_observer(record)
    trainer.train(resume_from_checkpoint=cli.resume)
    rank = trainer.accelerator.process_index
    name = "resumed" if cli.resume else "full"
    with open(os.path.join(cli.output_dir, f"{name}-rank{rank}.json"), "w") as f:
        json.dump(records, f)
    # Close the process group as riskpo-train does: left to interpreter exit, gloo's threads can abort a rank
    # ("terminate called without an active exception") after the run has finished.
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main()
