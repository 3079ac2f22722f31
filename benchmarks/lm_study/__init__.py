"""The tiny-LM study: GRPO, GSPO and RiskPO variants from an SFT start on a task with a hard tail (CPU).

Three protocols share the task, the model and the runs:

- ``python -m benchmarks.lm_study``: the short protocol (60 generation batches; :mod:`.short_protocol`);
- ``python -m benchmarks.lm_study.long_protocol``: the long-horizon protocol (600 generation batches, two starts,
  validation tracked along training; :mod:`.long_protocol`);
- ``python -m benchmarks.lm_study.exact_protocol``: the long protocol's decisive comparisons re-run from committed
  starts with exact evaluation and problem-level CIs (:mod:`.exact_protocol`); the baseline study
  (:mod:`.baseline_protocol`) and the frontier study (:mod:`.frontier_protocol`: RiskPO's variants against GRPO at
  matched Pass@1) build on it.

One job per module: :mod:`.config` (methods and sizes), :mod:`.task` (problems, splits, rewards), :mod:`.evaluation`
(sampled Pass@k and entropy on a split), :mod:`.exact` (exact success probabilities), :mod:`.stats` (bootstrap CIs),
:mod:`.sft` and :mod:`.starts` (the SFT starts; the exact protocol's are committed), :mod:`.run` (one RL run,
cached), :mod:`.diagnostics` (gradient noise at a start), the protocols, their reports (:mod:`.short_report`,
:mod:`.long_report`, :mod:`.exact_report`, :mod:`.baseline_report`, :mod:`.frontier_report`), :mod:`.frontier` and
:mod:`.frontier_store` (the frontier's definition and run files) and :mod:`.exact_check` (exact evaluation against
sampling).

Every protocol runs on the one pipeline (:mod:`benchmarks.pipeline`); :mod:`.plans` says which runs each needs.
Importing the study changes nothing: its entry points set the environment (no Hub, no trackers, no tokenizer
threads) before datasets, transformers or TRL are imported.
"""
