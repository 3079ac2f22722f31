"""Type checks of a YAML recipe's values against the parser's options, so a mistake in the recipe is reported with
the file and the field.

TrlParser installs a recipe's values as argparse defaults, which argparse converts only when they are strings: a
``max_steps: 6.5`` reaches the config unchecked and fails late inside transformers, and ``bundle_size: five`` fails
as if ``--bundle_size`` had been typed on the command line, after a usage dump of every option.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

_NUMBER_KINDS = {int: "an integer", float: "a number"}


def _value_problem(value: Any, action: argparse.Action) -> str | None:
    """What is wrong with ``value`` for ``action`` (as the command line's parsing would see it), or None."""
    if value is None:
        return None
    if action.nargs in ("+", "*") and isinstance(value, (list, tuple)):
        problems = [_value_problem(item, action) for item in value]
        return next((p for p in problems if p), None)
    convert = action.type
    if convert in _NUMBER_KINDS:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            return f"expected {_NUMBER_KINDS[convert]}, got {value!r}"
        if isinstance(value, float) and convert is int:
            return f"expected an integer, got {value!r}"
        if isinstance(value, str):
            try:
                convert(value)
            except ValueError:
                return f"expected {_NUMBER_KINDS[convert]}, got {value!r}"
    elif getattr(convert, "__name__", "") == "string_to_bool":
        if not isinstance(value, bool) and str(value).lower() not in (
            "yes",
            "true",
            "t",
            "y",
            "1",
            "no",
            "false",
            "f",
            "n",
            "0",
        ):
            return f"expected true or false, got {value!r}"
    if action.choices is not None and value not in action.choices and str(value) not in map(str, action.choices):
        return f"expected one of {list(action.choices)}, got {value!r}"
    return None


def check_recipe_values(parser: argparse.ArgumentParser, recipe: dict[str, Any], path: str | None) -> None:
    """Raise a ValueError listing every recipe field whose value the option would not accept, as
    ``path: field: expected an integer, got 6.5``."""
    actions = {action.dest: action for action in parser._actions}
    problems = []
    for name, value in recipe.items():
        action = actions.get(name)
        problem = action is not None and _value_problem(value, action)
        if problem:
            problems.append(f"{path}: {name}: {problem}")
    if problems:
        raise ValueError("; ".join(problems))


def _first_named(message: str, names: Sequence[str]) -> str | None:
    """The name in ``names`` that ``message`` mentions first (as a whole word), or None."""
    found = []
    for name in names:
        match = re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message)
        if match:
            found.append((match.start(), name))
    return min(found)[1] if found else None


def command_line_fields(argv: Sequence[str]) -> list[str]:
    """The fields given as ``--name value`` or ``--name=value`` on the command line (``--config`` names a file)."""
    names = [token.split("=", 1)[0][2:] for token in argv if token.startswith("--") and len(token) > 2]
    return [name for name in names if name != "config"]


def recipe_field_in(message: str, recipe: dict[str, Any], argv: Sequence[str]) -> str | None:
    """The recipe field a config's validation error names first (``bundle_size=0 must be ...``), among those the
    recipe set and the command line did not override; else None."""
    given = set(command_line_fields(argv))
    return _first_named(message, [name for name in recipe if name not in given])


def error_source(message: str, recipe: dict[str, Any], argv: Sequence[str], recipe_path: str | None) -> str | None:
    """Where the value a config's validation error is about came from: ``--bundle_size (command line)`` when the
    message names a field given on the command line (the recipe's values were checked together with it, and a flag
    is what the user just changed), else ``recipe.yaml: num_generations`` for a recipe field it names, else None
    (also for argparse's own errors, which name their option: ``argument --max_steps: ...``)."""
    if message.startswith("argument "):
        return None
    flag = _first_named(message, command_line_fields(argv))
    if flag is not None:
        return f"--{flag} (command line)"
    field = recipe_field_in(message, recipe, argv)
    return None if field is None else f"{recipe_path}: {field}"
