"""The training options of each registered trainer, checked without importing torch, transformers or TRL.

A misspelled field, a value of the wrong type or outside its choices must be refused at ``--help`` speed, not after
the seconds those imports take. The options of each trainer's config class and of ``trl.ModelConfig`` are kept in
the generated module ``known_options_data`` (``python -m riskpo_trl.scripts.known_options_build`` rewrites it; a
test regenerates it and compares), with the TRL and transformers versions it was generated at. Choices drawn from a
registry (``risk_profile``, ``advantage_baseline``, ...) are left to the full parser: entries can be registered at
run time. With other versions installed, :func:`light_parser` returns None and the full parser checks everything,
only later.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from typing import Any

# Versions whose options the generated list holds; TrlParser's conversion of each option's value by kind.
LIBRARIES = ("trl", "transformers")
TRUE_WORDS = ("yes", "true", "t", "y", "1")
FALSE_WORDS = ("no", "false", "f", "n", "0")


def string_to_bool(value: Any) -> bool:
    """transformers' ``string_to_bool``, by the same name (recipe_values recognises boolean options by it)."""
    if isinstance(value, bool):
        return value
    if value.lower() in TRUE_WORDS:
        return True
    if value.lower() in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, 1/0 (case insensitive)."
    )


KINDS = {"int": int, "float": float, "bool": string_to_bool, "str": str}


def installed_versions() -> dict[str, str]:
    return {name: importlib.metadata.version(name) for name in LIBRARIES}


def light_parser(trainer: str, script_arguments: type) -> tuple[argparse.ArgumentParser, str] | None:
    """``(parser, config class name)``: an ``argparse`` parser with every option the full parser of ``trainer`` has
    (``script_arguments``' own, the config class's and ``ModelConfig``'s), that raises a ValueError on a bad value;
    None when the installed TRL or transformers is not the version the list was generated at."""
    from . import known_options_data as data
    from .arguments import add_dataclass_arguments

    if installed_versions() != data.VERSIONS or trainer not in data.OPTIONS:
        return None
    config_name, options = data.OPTIONS[trainer]
    parser = argparse.ArgumentParser(prog="riskpo-train", add_help=False)
    add_dataclass_arguments(parser, script_arguments)
    for flags, dest, kind, nargs, choices in options:
        if kind == "store_false":
            parser.add_argument(*flags, dest=dest, action="store_false")
            continue
        extra = {"const": True} if kind == "bool" and nargs == "?" else {}
        parser.add_argument(*flags, dest=dest, type=KINDS[kind], nargs=nargs, choices=choices, **extra)

    def error(message: str):
        raise ValueError(f"{message} (riskpo-train --help-all lists every option)")

    parser.error = error
    return parser, config_name


def help_all_parser(trainer: str) -> argparse.ArgumentParser | None:
    """A parser whose help is the full parser's ``--help-all`` for ``trainer`` without a recipe (the texts, defaults
    and resolved defaults the list keeps), or None when the installed versions are not the list's."""
    from . import known_options_data as data

    if installed_versions() != data.VERSIONS or trainer not in data.HELP_ALL["options"]:
        return None
    parser = argparse.ArgumentParser()
    texts, rows = data.HELP_ALL["texts"], data.HELP_ALL["rows"]
    for flags, dest, nargs, metavar, choices, text in (rows[index] for index in data.HELP_ALL["options"][trainer]):
        shown = {"dest": dest, "help": texts[text].replace("%", "%%") or None}
        if nargs == 0:
            parser.add_argument(*flags, action="store_const", const=None, **shown)
        else:
            parser.add_argument(*flags, nargs=nargs, metavar=metavar, choices=choices, **shown)
    return parser


def trainer_fields(trainer: str) -> set[str] | None:
    """The field names of ``trainer``'s config class and ``ModelConfig`` from the list, or None (other versions)."""
    from . import known_options_data as data

    if installed_versions() != data.VERSIONS or trainer not in data.OPTIONS:
        return None
    return {dest for _, dest, _, _, _ in data.OPTIONS[trainer][1]}
