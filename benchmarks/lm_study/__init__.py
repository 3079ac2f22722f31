"""The tiny-LM study: GRPO, GSPO and RiskPO variants from an SFT start on a task with a hard tail (CPU).

Two protocols share the task, the model and the runs:

- ``python -m benchmarks.lm_study``: the short protocol (60 generation batches; :mod:`.short_protocol`);
- ``python -m benchmarks.lm_study.long_protocol``: the long-horizon protocol (600 generation batches, two starts,
  validation tracked along training; :mod:`.long_protocol`).

One job per module: :mod:`.config` (methods and sizes), :mod:`.task` (problems, splits, reward), :mod:`.evaluation`
(Pass@k and entropy on a split), :mod:`.sft` (the SFT starts), :mod:`.run` (one RL run, cached), :mod:`.diagnostics`
(gradient noise at a start), the two protocols, and their reports (:mod:`.short_report`, :mod:`.long_report`).
"""

import os

# Before datasets, transformers or TRL are imported anywhere in the study: no Hub, no trackers, no tokenizer threads.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
