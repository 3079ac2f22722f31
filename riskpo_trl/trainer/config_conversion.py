"""Config classes by field name: the typo hint of their constructor (:func:`name_misspelled_fields`), their docstring's
parameters written from the fields' help (:func:`documented_fields`), and a built GRPOConfig carried over to another
config class (``RiskPOConfig.from_grpo_config``: :func:`from_grpo_config`)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import textwrap
from dataclasses import fields
from typing import Any

from transformers.utils import logging as transformers_logging

from ..registry import closest_name
from ..risk.defaults import PAPER_ADVANTAGE_BASELINE, resolve_advantage_baseline
from .caller_warnings import remember_set_fields

logger = transformers_logging.get_logger(__name__)
# Settings a config no longer holds because they are the training job's, for every trainer, by their SyncSettings name.
JOB_SETTINGS = {
    "vllm_generation_timeout": "generation_timeout_s",
    "vllm_sync_timeout": "sync_timeout_s",
    "vllm_check_every": "check_every",
}


def name_misspelled_fields(config_class: type) -> type:
    """Make ``config_class(bundel_size=2)`` say which field was meant, instead of the dataclass's bare 'unexpected
    keyword argument'."""
    generated_init = config_class.__init__

    @functools.wraps(generated_init)
    def __init__(self, *args, **kwargs):
        accepted = init_field_names(config_class)
        for name in kwargs:
            if name in JOB_SETTINGS and name not in accepted:
                raise TypeError(
                    f"{name} is a setting of the training job, not of {config_class.__name__}: pass --{name} to "
                    f"riskpo-train, or riskpo_trl.job.build(..., weight_sync=SyncSettings({JOB_SETTINGS[name]}=...)) "
                    "with SyncSettings from riskpo_trl.weight_sync.bounded."
                )
            if name not in accepted:
                raise TypeError(
                    f"{config_class.__name__} got an unexpected keyword argument {name!r}"
                    f"{closest_name(name, accepted)}."
                )
        remember_set_fields(self, kwargs)
        generated_init(self, *args, **kwargs)

    config_class.__init__ = __init__
    return config_class


def documented_fields(config_class: type, sections: dict[str, str], registries_module: str) -> str:
    """The Parameters of ``config_class``'s docstring in the Hugging Face doc format, ``sections`` (title -> field
    names, space-separated) each field's ``help``; a field's registry of choices is named as ``registries_module``'s
    attribute (the field's name in capitals, plural: ``RISK_PROFILES``)."""
    by_name = {f.name: f for f in fields(config_class)}
    lines = []
    for title, names in sections.items():
        lines += [f"        > {title}", ""]
        for name in names.split():
            field, registry = by_name[name], by_name[name].metadata.get("choices")
            shown = f'"{field.default}"' if isinstance(field.default, str) else repr(field.default)
            default = "" if field.default is None else f", defaults to `{shown}`"
            kind = str(field.type).replace(" | None", "")
            lines.append(f"        {name} (`{kind}`, *optional*{default}):")
            text = field.metadata["help"]
            if registry is not None:
                text = text.replace("%(choices)s", f"one of [`~{registries_module}.{registry.field.upper()}S`]")
            lines += textwrap.wrap(text, 120, initial_indent=" " * 12, subsequent_indent=" " * 12)
        lines.append("")
    return "\n".join(lines) + "    "


def from_grpo_config(
    config_class: type, grpo_config: Any, risk_fields: dict[str, Any], updates_per_generation: int
) -> Any:
    """``config_class`` with every setting of ``grpo_config`` (tokens included) plus ``risk_fields``; one warning names
    the carried-over settings that differ from the paper's (:func:`settings_off_the_papers`) and the advantage baseline
    when it is not the paper's and was not passed."""
    config = config_class(**converted_config_kwargs(grpo_config, config_class, risk_fields))
    kept = settings_off_the_papers(config, config_class, set(risk_fields), updates_per_generation)
    baseline = resolve_advantage_baseline(config.advantage_baseline, config.advantage_scaling)
    differing = [f"kept the GRPO config's {', '.join(kept)}"] if kept else []
    if "advantage_baseline" not in risk_fields and baseline != PAPER_ADVANTAGE_BASELINE:
        differing.append(
            f"uses advantage_baseline={baseline!r} (the library's default; paper: {PAPER_ADVANTAGE_BASELINE!r})"
        )
    if differing:
        logger.warning(
            f"{config_class.__name__}.from_grpo_config {' and '.join(differing)}; pass any of them to "
            "from_grpo_config to use the paper's."
        )
    return config


# Deprecated fields that GRPOConfig copies into their replacement in __post_init__; passing both again would only
# repeat the deprecation warning.
_DEPRECATED_ALIASES = {
    "vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max",
    "use_transformers_paged": "use_transformers_continuous_batching",
}


def init_field_names(config_class: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config_class) if f.init}


# GRPO settings that define the paper's method, whose RiskPOConfig defaults are the paper's.
PAPER_GRPO_SETTINGS = ("importance_sampling_level", "loss_type", "temperature", "num_generations", "epsilon", "beta")


def settings_off_the_papers(
    config: Any, config_class: type, chosen: set[str], updates_per_generation: int
) -> list[str]:
    """``"loss_type='dapo' (paper: 'grpo')"``, ... for each of :data:`PAPER_GRPO_SETTINGS` (and the optimizer updates
    per generation batch) where ``config`` differs from ``config_class``'s default, leaving out the fields in
    ``chosen`` (set on purpose)."""
    defaults = {f.name: f.default for f in fields(config_class)}
    differing = [
        f"{name}={getattr(config, name)!r} (paper: {defaults[name]!r})"
        for name in PAPER_GRPO_SETTINGS
        if name not in chosen and getattr(config, name) != defaults[name]
    ]
    updates = config.steps_per_generation / config.gradient_accumulation_steps
    if not chosen & {"steps_per_generation", "generation_batch_size"} and updates != updates_per_generation:
        differing.append(
            f"{updates:g} optimizer update(s) per generation batch (steps_per_generation="
            f"{config.steps_per_generation}; paper: {updates_per_generation})"
        )
    return differing


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
        hints = [f"{name!r}{closest_name(name, target_fields)}" for name in unknown]
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
