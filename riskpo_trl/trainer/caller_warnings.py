"""Warnings about the caller's own code, and only those.

A warning from a config check would otherwise point at the dataclass's generated ``__init__`` (``<string>``), this
package's config modules or transformers' and TRL's argument parsing; :func:`caller_stacklevel` walks past them to the
user's ``RiskPOConfig(...)`` line, or the script that parsed a recipe. A renamed GRPO script hears which GRPO defaults
the paper's layout replaced (:func:`warn_replaced_grpo_defaults`). The libraries' notices no user can act on are the
job layer's (``riskpo_trl.job.library_warnings``): no trainer or config installs a filter. This module imports no
heavy library at import time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from collections.abc import Iterator

# transformers 5 deprecates the gradient-checkpointing names that GRPOConfig's default (`gradient_checkpointing=True`)
# and TRL's generation context use; said while a config is built only when the caller set that field.
GRADIENT_CHECKPOINTING_DEPRECATION = r"`(is_)?gradient_checkpointing\w*` is deprecated and will be removed in v6"
WARNING_WIDTH = 100  # a long warning is wrapped to lines a terminal or notebook shows whole
SET_FIELDS_ATTRIBUTE = "_fields_set_by_caller"  # on a config: the fields its constructor's caller passed


@contextlib.contextmanager
def config_default_warnings_silenced(config) -> Iterator[None]:
    """While a config is built: transformers' deprecation of ``gradient_checkpointing`` is ignored when the caller
    did not set that field (it comes from GRPOConfig's default), and shown when the caller did."""
    chosen = getattr(config, SET_FIELDS_ATTRIBUTE, None)
    with warnings.catch_warnings():
        if chosen is not None and "gradient_checkpointing" not in chosen:
            warnings.filterwarnings("ignore", message=GRADIENT_CHECKPOINTING_DEPRECATION, category=FutureWarning)
        yield


_HERE = os.path.dirname(os.path.abspath(__file__))
# The modules a config's construction passes through in this package.
CONFIG_MODULES = tuple(
    os.path.join(_HERE, name)
    for name in ("config.py", "config_checks.py", "config_conversion.py", "caller_warnings.py")
)


def caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning raised while a config is built to the code that built it: the
    user's ``RiskPOConfig(...)`` line (or the script that parsed a recipe), not the dataclass's generated
    ``__init__`` (``<string>``), this package's config modules or transformers' and TRL's argument handling."""
    import transformers
    import trl

    skipped = (*CONFIG_MODULES, os.path.abspath(dataclasses.__file__))
    library_dirs = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep for module in (transformers, trl))
    frame = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None:
        filename = frame.f_code.co_filename
        if not (
            filename == "<string>"
            or os.path.abspath(filename) in skipped
            or os.path.abspath(filename).startswith(library_dirs)
        ):
            break
        frame = frame.f_back
        level += 1
    return level


# --- a GRPO script renamed to RiskPO: the GRPO defaults the paper's layout replaced, said once at start-up


def remember_set_fields(config, names) -> None:
    """Record which fields the caller of a config's constructor passed (the parser and ``from_grpo_config`` pass
    every field: nothing is left to the defaults there)."""
    object.__setattr__(config, SET_FIELDS_ATTRIBUTE, frozenset(names))


# Fields whose default is not GRPOConfig's but which change only what the console shows, not the run's layout.
CONSOLE_FIELDS = frozenset({"num_completions_to_print"})


def replaced_grpo_defaults(config) -> list[str]:
    """``"gradient_accumulation_steps=5 (GRPOConfig: 1)"``, ... for each field the caller left unset whose default is
    not GRPOConfig's, and for the generation batch those defaults change (``steps_per_generation``,
    ``generation_batch_size``); empty for a config whose set fields are unknown (unpickled, say)."""
    from trl import GRPOConfig

    chosen = getattr(config, SET_FIELDS_ATTRIBUTE, None)
    if chosen is None:
        return []
    grpo, own = _defaults(GRPOConfig), _defaults(type(config))
    replaced = [
        f"{name}={getattr(config, name)!r} (GRPOConfig: {grpo[name]!r})"
        for name in own
        if name in grpo and name not in chosen and own[name] != grpo[name] and name not in CONSOLE_FIELDS
    ]
    if not chosen & {"steps_per_generation", "generation_batch_size"}:

        def grpo_value(name):
            return getattr(config, name) if name in chosen else grpo[name]

        grpo_steps = grpo_value("gradient_accumulation_steps")  # GRPOConfig: one generation per optimizer step
        grpo_batch = grpo_value("per_device_train_batch_size") * config.world_size * grpo_steps
        for name, grpo_layout in (("steps_per_generation", grpo_steps), ("generation_batch_size", grpo_batch)):
            if getattr(config, name) != grpo_layout:
                replaced.append(f"{name}={getattr(config, name)!r} (GRPOConfig: {grpo_layout!r})")
    return replaced


def warn_replaced_grpo_defaults(config, logger) -> None:
    """One warning naming :func:`replaced_grpo_defaults`, with the way to keep GRPO's."""
    replaced = replaced_grpo_defaults(config)
    if replaced:
        name = type(config).__name__
        listed = "\n".join(f"  {line}" for line in _comma_lines(replaced, WARNING_WIDTH - 2))
        logger.warning(
            f"{name} left these at the paper's layout, not GRPOConfig's defaults:\n{listed}\nSet them to choose, or "
            f"keep a GRPO script's with\n  {name}.from_grpo_config(GRPOConfig(...), bundle_size=...)."
        )


def _comma_lines(items: list[str], width: int) -> list[str]:
    """``items`` joined by ", " into lines of at most ``width`` characters, never splitting an item."""
    lines = [items[0]]
    for item in items[1:]:
        if len(lines[-1]) + 2 + len(item) + 1 > width:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] += f", {item}"
    return lines


def _defaults(config_class: type) -> dict:
    values = {}
    for field in dataclasses.fields(config_class):
        if field.init and field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.init and field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
    return values
