"""Writes ``known_options_data``, the option list :mod:`riskpo_trl.scripts.known_options` checks against, from the
full parser of every registered trainer (imports TRL)::

    python -m riskpo_trl.scripts.known_options_build
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..registry import Registry
from .known_options import installed_versions


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreFalseAction):
        return "store_false"
    name = getattr(action.type, "__name__", "")
    if name == "string_to_bool":
        return "bool"
    return name if name in ("int", "float") else "str"


# The fields the checks before imports read (riskpo_trl.scripts.early_checks), whose defaults the list keeps.
LAYOUT_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "steps_per_generation",
    "generation_batch_size",
    "bundle_size",
    "max_steps",
    "num_train_epochs",
    "resume_from_checkpoint",
)


def layout_defaults(config_class: type) -> dict:
    """``config_class``'s defaults of :data:`LAYOUT_FIELDS` (those it has), and ``steps_per_accumulation``: the
    steps_per_generation it derives per gradient_accumulation_steps when neither it nor generation_batch_size is
    set (RiskPO's 4, GRPO's 1), read from a config built with the defaults."""
    import dataclasses
    import tempfile

    defaults = {f.name: f.default for f in dataclasses.fields(config_class) if f.name in LAYOUT_FIELDS}
    with tempfile.TemporaryDirectory() as output_dir:
        config = config_class(output_dir=output_dir, use_cpu=True, bf16=False)
    defaults["steps_per_accumulation"] = config.steps_per_generation // config.gradient_accumulation_steps
    return defaults


def help_rows(parser: argparse.ArgumentParser, texts: list[str], rows: list[tuple]) -> list[int]:
    """``--help-all``'s options as the full parser shows them without a recipe, as indexes into ``rows``: each row is
    (flags, dest, nargs, metavar, choices, index of the help text in ``texts``), the help text with its default (or
    the default the config resolves) and a registry's entries written out. What the trainers share is kept once."""
    formatter = parser._get_formatter()
    used = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        if text not in texts:
            texts.append(text)
        choices = None if action.choices is None else [str(getattr(c, "value", c)) for c in action.choices]
        row = (list(action.option_strings), action.dest, action.nargs, action.metavar, choices, texts.index(text))
        if row not in rows:
            rows.append(row)
        used.append(rows.index(row))
    return used


def generate() -> tuple[dict[str, str], dict[str, tuple[str, list]], dict[str, list[str]], dict[str, dict], dict]:
    """``(VERSIONS, OPTIONS, REWARDS, LAYOUT, HELP)``: the options of the full parser of every registered trainer,
    without the script's own options, the registered reward names (the reward registry imports TRL), each trainer's
    :func:`layout_defaults`, and ``--help-all``'s options of each trainer (:func:`help_rows`) with their texts."""
    import dataclasses

    from ..tracks import REWARD_BUILDERS, REWARD_FUNCS
    from ..trainer.registry import TRAINERS, get_trainer_classes
    from .train import RiskPOScriptArguments, make_parser, show_resolved_defaults

    script_fields = {field.name for field in dataclasses.fields(RiskPOScriptArguments)}
    options, layout, texts, help_table, help_options = {}, {}, [], [], {}
    for trainer in TRAINERS:
        config_class, _ = get_trainer_classes(trainer)
        rows = []
        for action in make_parser(config_class)._actions:
            if isinstance(action, argparse._HelpAction) or action.dest in script_fields:
                continue
            # A registry's entries can grow at run time (a new risk profile is one decorated function): the full
            # parser checks those against the live registry, later.
            choices = None
            if action.choices is not None and not isinstance(action.choices, Registry):
                choices = [getattr(c, "value", c) for c in action.choices]
            rows.append((list(action.option_strings), action.dest, _kind(action), action.nargs, choices))
        options[trainer] = (config_class.__name__, rows)
        layout[trainer] = layout_defaults(config_class)
        full = make_parser(config_class)
        show_resolved_defaults(full, config_class, {})
        help_options[trainer] = help_rows(full, texts, help_table)
    rewards = {"functions": list(REWARD_FUNCS), "builders": list(REWARD_BUILDERS)}
    help_all = {"texts": texts, "rows": help_table, "options": help_options}
    return installed_versions(), options, rewards, layout, help_all


def render(
    versions: dict[str, str],
    options: dict[str, tuple[str, list]],
    rewards: dict[str, list[str]],
    layout: dict[str, dict],
    help_all: dict,
) -> str:
    """The source of ``known_options_data``."""
    import pprint

    lines = [
        '"""Generated by `python -m riskpo_trl.scripts.known_options_build`; do not edit.',
        "",
        "Each trainer: its config class and its options (flags, field, kind, nargs, choices), those of ModelConfig",
        'included; the registered rewards; each trainer\'s batch-layout defaults and --help-all options."""',
        "",
        f"VERSIONS = {versions!r}",
        "OPTIONS = " + pprint.pformat(options, width=119, compact=True, sort_dicts=True),
        f"REWARDS = {rewards!r}",
        "LAYOUT = " + pprint.pformat(layout, width=119, sort_dicts=True),
        "HELP_ALL = " + pprint.pformat(help_all, width=119, compact=True, sort_dicts=True),
        "",
    ]
    return "\n".join(lines)


DATA_FILE = Path(__file__).with_name("known_options_data.py")

if __name__ == "__main__":
    DATA_FILE.write_text(render(*generate()))
    print(f"wrote {DATA_FILE}")
