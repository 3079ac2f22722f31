"""Run by tests/test_token_mean_groups.py under `accelerate launch` (2 CPU processes, DDP): two optimizer steps
(learning rate 0) on made-up completions of mixed lengths, different on each rank, with loss_token_mean_sequences
set so that groups span both processes; each rank saves the micro-batches its loss saw and the all-reduced gradient
before each optimizer step.

    distributed_token_mean.py OUTPUT_DIR MODEL_DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from test_token_mean_groups import DISTRIBUTED_LAYOUT, train_on_a_made_up_batch  # noqa: E402


def main() -> None:
    output_dir, model_dir = Path(sys.argv[1]), sys.argv[2]
    _, gradients, seen, trainer = train_on_a_made_up_batch(model_dir, output_dir / "run", **DISTRIBUTED_LAYOUT)
    rank = trainer.accelerator.process_index
    torch.save({"gradients": gradients, "micro_batches": seen}, output_dir / f"rank{rank}.pt")
    trainer.accelerator.end_training()  # close the process group before exit, as riskpo-train does


if __name__ == "__main__":
    main()
