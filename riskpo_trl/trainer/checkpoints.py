"""What a RiskPO checkpoint holds besides TRL's, and how it loads.

- The advantage step's state (the quantile trackers, the regime guard) is written next to the optimizer, in
  ``riskpo_state.json``, atomically (:func:`write_state`, :func:`read_state`).
- Tied weights on resume: a checkpoint stores a tied weight once (``lm_head.weight`` is the embedding's tensor in a
  model with ``tie_word_embeddings``), so loading it with ``strict=False`` lists the tied copy as missing although it
  already holds the loaded values; :class:`TiedWeightsResumeMixin` keeps the resume warning for real gaps only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torch import nn

RISK_STATE_FILE = "riskpo_state.json"


def write_state(output_dir: str, state: dict[str, Any]) -> None:
    """Write ``state`` as ``output_dir/riskpo_state.json``; atomic, so a kill mid-write leaves no half-written file."""
    path = os.path.join(output_dir, RISK_STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=2)
    os.replace(path + ".tmp", path)


def read_state(checkpoint: str) -> dict[str, Any]:
    """The state :func:`write_state` wrote into ``checkpoint``; a checkpoint without one is refused by name."""
    path = os.path.join(checkpoint, RISK_STATE_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{checkpoint} has no {RISK_STATE_FILE}, so the quantile trackers cannot be restored. Resume from a "
            "checkpoint written by RiskPOTrainer, or start a fresh run."
        )
    with open(path) as f:
        return json.load(f)


def tied_parameter_names(model: nn.Module) -> set[str]:
    """Names of the parameters that are the very tensor of the parameter they are tied to (``lm_head.weight`` in a
    tied-embeddings model): loading the one loads the other."""
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    parameters = dict(model.named_parameters(remove_duplicate=False))
    return {
        target for target, source in tied.items()
        if target in parameters and source in parameters and parameters[target] is parameters[source]
    }


def without_tied_missing_keys(model: nn.Module, load_result: Any) -> Any:
    """``load_result`` (a ``load_state_dict`` result) without the missing keys that are tied to a loaded tensor."""
    shared = tied_parameter_names(model)
    missing = [key for key in load_result.missing_keys if key not in shared]
    return load_result._replace(missing_keys=missing)


class TiedWeightsResumeMixin:
    """For a `transformers.Trainer`: the resume warning about missing keys leaves out the tied copies."""

    def _issue_warnings_after_load(self, load_result) -> None:
        super()._issue_warnings_after_load(without_tied_missing_keys(self.model, load_result))
