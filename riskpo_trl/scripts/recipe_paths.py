"""Paths in a recipe, read from any working directory.

A recipe names its inputs relative to its repository (``examples/data/tiny_arithmetic.jsonl``), the directory that
holds its ``recipes/`` folder. Run from another directory, such a path that does not exist there is read from the
recipe's repository; one that exists in neither is refused by name before anything is built. What a run writes
(``output_dir``, a model ``build_tiny_model`` builds) stays relative to the working directory, as for any command.
A recipe path that does not exist gets the closest recipe's path in its error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..registry import closest, did_you_mean
from .recipe_values import command_line_fields

# Fields whose relative paths name inputs; dataset_files must exist, the others may be a Hub id or a registered name.
INPUT_PATH_FIELDS = ("dataset_files", "dataset_name", "model_name_or_path")
# This source checkout's recipes, when the package runs from one (an editable install); not in a wheel.
CHECKOUT = Path(__file__).resolve().parents[2]
MAX_SCANNED_FILES = 5000


def recipe_repository(recipe_path: str) -> Path:
    """The directory holding the ``recipes/`` folder the recipe is in; the recipe's own directory if it is in none."""
    path = Path(recipe_path).resolve()
    for parent in path.parents:
        if parent.name == "recipes":
            return parent.parent
    return path.parent


def check_recipe_exists(recipe_path: str) -> None:
    """Raise FileNotFoundError for a missing recipe, naming the closest existing one. Something that is there but not
    a file (a FIFO, a directory) is left to the reader, which refuses it by what it is."""
    if os.path.exists(recipe_path):
        return
    match = _closest(recipe_path, {path: path for path in _recipes_near(recipe_path)})
    if match is None and CHECKOUT.joinpath("recipes").is_dir():  # run from elsewhere: the checkout's own recipes
        shipped = CHECKOUT.joinpath("recipes").rglob("*.yaml")
        match = _closest(recipe_path, {str(path.relative_to(CHECKOUT)): str(path) for path in shipped})
    raise FileNotFoundError(f"Recipe {recipe_path}: no such file{did_you_mean(match)}.")


def _closest(name: str, candidates: dict[str, str]) -> str | None:
    """The value of the key of ``candidates`` closest to ``name``, or None when none is close."""
    match = closest(os.path.normpath(name), candidates)
    return candidates[match] if match else None


def _recipes_near(recipe_path: str) -> list[str]:
    """YAML files under the closest existing directory of ``recipe_path``, as paths written the same way."""
    directory = os.path.dirname(recipe_path) or "."
    while not os.path.isdir(directory):
        directory = os.path.dirname(directory) or "."
    found = []
    for root, _, files in os.walk(directory):
        found += [os.path.normpath(os.path.join(root, name)) for name in files if name.endswith((".yaml", ".yml"))]
        if len(found) > MAX_SCANNED_FILES:
            break
    return found


def resolved_path_options(recipe: dict[str, Any], recipe_path: str, argv: Sequence[str]) -> list[str]:
    """Command-line options that give the recipe's relative input paths as read from its repository, for those that
    do not exist from the working directory and that the command line does not set itself."""
    repository = recipe_repository(recipe_path)
    given = set(command_line_fields(argv))
    options: list[str] = []
    for name in INPUT_PATH_FIELDS:
        if name not in recipe or name in given or recipe[name] is None:
            continue
        values = recipe[name] if isinstance(recipe[name], list) else [recipe[name]]
        resolved = [_resolve(value, repository, recipe_path, name) for value in values]
        if resolved != values:
            options += [f"--{name}", *map(str, resolved)]
    block = recipe.get("pass_at_k")
    if isinstance(block, dict) and "pass_at_k" not in given and isinstance(block.get("benchmarks"), list):
        benchmarks = [_resolve_benchmark(entry, repository, recipe_path) for entry in block["benchmarks"]]
        if benchmarks != block["benchmarks"]:
            options += ["--pass_at_k", json.dumps({**block, "benchmarks": benchmarks})]
    return options


def _resolve(value: Any, repository: Path, recipe_path: str, name: str) -> Any:
    if not isinstance(value, str) or os.path.isabs(value) or value.startswith("~") or os.path.exists(value):
        return value
    if (repository / value).exists():
        return str(repository / value)
    if name == "dataset_files":
        raise FileNotFoundError(
            f"{recipe_path}: {name}: {value}: no such file here ({os.getcwd()}) or in the recipe's repository "
            f"({repository})."
        )
    return value  # a Hub id, a registered name, or a model build_tiny_model builds here


def _resolve_benchmark(entry: Any, repository: Path, recipe_path: str) -> Any:
    if not isinstance(entry, str) or "=" not in entry:
        return entry
    name, _, path = entry.partition("=")
    return f"{name}={_resolve(path, repository, recipe_path, 'dataset_files')}"
