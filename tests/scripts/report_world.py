"""Run under `accelerate launch`: each process writes what the Trainer's arguments see of the launch."""

import json
import sys
from pathlib import Path

import torch.distributed as dist
from transformers import TrainingArguments

output_dir = Path(sys.argv[1])
# use_cpu as in the CPU recipes: it is what makes each launched process pick gloo on the CPU.
args = TrainingArguments(output_dir=str(output_dir), use_cpu=True, report_to="none")
report = {
    "process_index": args.process_index,
    "world_size": args.world_size,
    "device": str(args.device),
    "backend": dist.get_backend() if dist.is_initialized() else None,
    "process_group_size": dist.get_world_size() if dist.is_initialized() else None,
}
(output_dir / f"rank{args.process_index}.json").write_text(json.dumps(report))
