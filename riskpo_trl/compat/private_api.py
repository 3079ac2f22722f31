"""The private API of TRL and transformers the package uses, by owner, with the signatures and behaviour relied on
checked in TRL 1.13.0, 1.14.2 and 1.16.0 and transformers 4.56.2, 5.23.0 and 5.24.0 (`tests/test_compat.py` checks
`PRIVATE_METHODS`, `PRIVATE_CLASS_ATTRIBUTES` and `PRIVATE_ATTRIBUTES` against the installed releases;
`tests/test_private_api_scan.py` reads the package's code for every private name of TRL, transformers, accelerate
and vLLM it overrides, calls or reads, and fails on one missing from these lists):

- `GRPOTrainer` methods the trainer's classes override (`PRIVATE_METHODS`): `_calculate_rewards` (returns the rewards
  gathered over processes: `check_gathered_rewards`), `_generate_and_score_completions` (returns a dict with
  ``advantages``, after logging the gathered ones: `check_logged_advantages`), `_prepare_inputs` (returns the
  buffered micro-batch ``_step % steps_per_generation``: `check_buffered_micro_batch`), `_compute_loss`; and
  `transformers.Trainer`'s `_save_optimizer_and_scheduler` and `_load_optimizer_and_scheduler`; the job layer wraps
  `_load_optimizer_and_scheduler`, `_issue_warnings_after_load`, `_save_checkpoint` and `_calculate_rewards` on a
  trainer object, and calls `_save_checkpoint` when a vLLM server times out. The three checks (`riskpo_trl.compat`)
  raise `TRLChangedError`, naming the installed TRL, when TRL stops behaving so.
- `GRPOTrainer` attributes read or written (`PRIVATE_ATTRIBUTES`): `_metrics[mode]`, `_logs["advantages"]` and
  `_logs["extra"]` (the completions table), `_buffered_inputs` (the generation batch's micro-batches), `_step`,
  `_is_vlm` (the model card); the class attributes `_tag_names`, `_name` and `_paper` (`PRIVATE_CLASS_ATTRIBUTES`)
  feed the model card too.
- No advantage hook: TRL up to 1.16 computes GRPO's advantage inline. `trl_advantage_hook` names one when the
  installed TRL defines it (docs/architecture.md: the plan for using it).
- TRL helpers: `trl.trainer.utils.get_config_model_id`, `trl.models.utils.unwrap_model_for_generation` (through
  `unwrap_for_generation`), `trl.trainer.utils.is_async_callable` (through `trl_awaits`), `trl.experimental.gmpo`
  (the GMPO baseline).

The TRL and vLLM API of vLLM server mode on CPU is described in `compat.serving`.
"""

from __future__ import annotations

import inspect

# The private API used, by owner: what tests/test_private_api_scan.py finds in the package's code must be listed
# here, and tests/test_compat.py checks each entry against the installed releases. Methods overridden or called,
# with their parameters after ``self``:
PRIVATE_METHODS = {
    "trl.GRPOTrainer": {
        "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
        "_generate_and_score_completions": ("inputs",),
        "_prepare_inputs": ("generation_batch",),
        "_compute_loss": ("model", "inputs"),
    },
    "transformers.Trainer": {
        "_save_optimizer_and_scheduler": ("output_dir",),
        "_load_optimizer_and_scheduler": ("checkpoint",),
        "_issue_warnings_after_load": ("load_result",),
        "_save_checkpoint": ("model", "trial"),  # a checkpoint written when a vLLM server times out (preemption)
    },
    "trl.generation.vllm_client.VLLMClient": {
        "_get": ("url", "kwargs"),
        "_post": ("url", "kwargs"),
        "_start_weight_update": (),
        "_finish_weight_update": (),
    },
}
# Class attributes overridden or read (the model card's).
PRIVATE_CLASS_ATTRIBUTES = {"trl.GRPOTrainer": ("_tag_names", "_name", "_paper")}
# Attributes of built objects, read or written (set by the owner's constructor or, for vLLM's worker, its weight
# update).
PRIVATE_ATTRIBUTES = {
    "trl.GRPOTrainer": ("_metrics", "_logs", "_buffered_inputs", "_step", "_is_vlm"),
    "trl.generation.vllm_client.VLLMClient": ("_updating_weights",),
    "vllm.v1.worker.gpu_worker.Worker": ("_weight_update_active",),
}


# Names an advantage hook has in TRL releases, with its parameters after ``self``: a method called with the gathered
# advantages before they are logged and sliced per process, returning the advantages to use (an open TRL pull
# request adds `_transform_advantages(advantages)`; no release up to 1.16 has one).
ADVANTAGE_HOOKS = {"_transform_advantages": ("advantages",)}


def trl_advantage_hook() -> str | None:
    """The name of the installed `GRPOTrainer`'s advantage hook (one of `ADVANTAGE_HOOKS`, with their parameters), or
    None when it has none: then the trainer replaces GRPO's advantages after `_generate_and_score_completions`."""
    from trl import GRPOTrainer

    for name, parameters in ADVANTAGE_HOOKS.items():
        method = getattr(GRPOTrainer, name, None)
        if callable(method) and tuple(inspect.signature(method).parameters)[1:] == parameters:
            return name
    return None
