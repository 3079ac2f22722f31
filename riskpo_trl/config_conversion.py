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
    nested configs. Of the pair ``generation_batch_size`` / ``steps_per_generation``, which GRPOConfig derives from each
    other and refuses both of, ``steps_per_generation`` carries over, so the source's generation schedule stays (GRPO's
    default is one generation batch per optimizer step, not RiskPOConfig's four); with the source's default relation
    (``steps_per_generation == gradient_accumulation_steps``) a new ``gradient_accumulation_steps`` moves it along.
    ``overrides`` win over the source's values; naming either field of the pair replaces both.
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
    if {"generation_batch_size", "steps_per_generation"} & set(overrides):
        kwargs.pop("steps_per_generation", None)
    elif "gradient_accumulation_steps" in overrides and kwargs.get("steps_per_generation") == getattr(
        source, "gradient_accumulation_steps", None
    ):
        kwargs["steps_per_generation"] = overrides["gradient_accumulation_steps"]
    kwargs.update(overrides)
    return kwargs
