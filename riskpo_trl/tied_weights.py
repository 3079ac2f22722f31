"""Tied weights on resume: a checkpoint stores a tied weight once (``lm_head.weight`` is the embedding's tensor in a
model with ``tie_word_embeddings``), so loading it with ``strict=False`` lists the tied copy as missing although it
already holds the loaded values. Used to keep the trainer's resume warning for real gaps only."""

from __future__ import annotations

from typing import Any

from torch import nn


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
