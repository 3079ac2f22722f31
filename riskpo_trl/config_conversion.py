"""Carry a built `GRPOConfig` over to another config class (RiskPOConfig.from_grpo_config)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
from typing import Any

# Deprecated fields that GRPOConfig copies into their replacement in __post_init__; passing both again would only
# repeat the deprecation warning.
_DEPRECATED_ALIASES = {
    "vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max",
    "use_transformers_paged": "use_transformers_continuous_batching",
}


def init_field_names(config_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class) if f.init}


def converted_config_kwargs(source: Any, target_class: type, overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments that rebuild ``source`` (a built TrainingArguments/GRPOConfig) as ``target_class``.

    Values are read from the attributes, not from ``to_dict()``, which masks tokens (``hub_token``) and flattens
    nested configs. ``generation_batch_size`` / ``steps_per_generation`` are a pair GRPOConfig derives one from the
    other, and it refuses both: ``steps_per_generation`` is kept when it differs from ``gradient_accumulation_steps``
    (the user chose the generation batch), both are dropped otherwise or when ``overrides`` names either, so they are
    derived again from the final batch fields. ``overrides`` win over the source's values.
    """
    target_fields = init_field_names(target_class)
    unknown = sorted(set(overrides) - target_fields)
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(target_fields), n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise TypeError(f"{target_class.__name__} has no field {', '.join(hints)}.")

    kwargs = {
        name: copy.deepcopy(getattr(source, name))
        for name in init_field_names(type(source)) & target_fields
        if hasattr(source, name)
    }
    for old, new in _DEPRECATED_ALIASES.items():
        if old in kwargs and new in kwargs and kwargs[old] is not None and kwargs[old] == kwargs[new]:
            kwargs.pop(old)
    kwargs.pop("generation_batch_size", None)
    steps = kwargs.pop("steps_per_generation", None)
    chosen = steps is not None and steps != getattr(source, "gradient_accumulation_steps", None)
    if chosen and not {"generation_batch_size", "steps_per_generation"} & set(overrides):
        kwargs["steps_per_generation"] = steps
    kwargs.update(overrides)
    return kwargs
