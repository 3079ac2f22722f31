"""An ``argparse`` parser from a dataclass's fields, for the console scripts' own options.

``transformers.HfArgumentParser`` does the same but takes seconds to import; ``--help`` should answer at once. The
command-line forms match it: ``--flag`` or ``--flag true|false`` for booleans, space-separated values for lists.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any

from ..registry import Registry


class RegistryHelpMixin:
    """For an ``argparse`` help formatter: an option whose ``choices`` is a :class:`~riskpo_trl.registry.Registry`
    shows ``%(choices)s`` in its help as the registry's entries with their help, read when the help is shown (an entry
    registered after import is listed; argparse checks a value against the live registry too)."""

    def _expand_help(self, action: argparse.Action) -> str:
        if isinstance(action.choices, Registry) and action.help:
            action = copy.copy(action)
            action.help = action.help.replace("%(choices)s", action.choices.describe().replace("%", "%%"))
        return super()._expand_help(action)  # type: ignore[misc]


class RegistryDefaultsHelpFormatter(RegistryHelpMixin, argparse.ArgumentDefaultsHelpFormatter):
    """transformers' ``HfArgumentParser`` formatter (defaults shown) with the registries' entries. An option with a
    ``resolved_default`` (a None default the config resolves: ``advantage_baseline`` becomes ``loo``) shows that."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = super()._get_help_string(action) or ""
        resolved = getattr(action, "resolved_default", None)
        if resolved is not None and "(default: %(default)s)" in text:
            shown = str(resolved).replace("%", "%%")
            text = text.replace("(default: %(default)s)", f"(default: {shown}, resolved from None)")
        return text


class RegistryRawDescriptionHelpFormatter(RegistryHelpMixin, argparse.RawDescriptionHelpFormatter):
    """The short help's formatter: the description and epilog as written, with the registries' entries."""


def _parse_bool(value: str) -> bool:
    if value.lower() in ("true", "yes", "1"):
        return True
    if value.lower() in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        # `dict | str` fields take a JSON string on the command line
        return str if str in options or len(options) > 1 else options[0]
    return annotation


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One ``--name`` option per init field of ``cls`` (str, int, float, bool, lists of those, optional ones)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        kind = _without_none(hints[field.name])
        options: dict[str, Any] = {"help": field.metadata.get("help")}
        if "choices" in field.metadata:
            options["choices"] = field.metadata["choices"]
        if typing.get_origin(kind) is list:
            options.update(nargs="+", type=typing.get_args(kind)[0])
        elif kind is bool:
            options.update(nargs="?", const=True, type=_parse_bool, metavar="{true,false}")
        elif kind in (int, float, str):
            options["type"] = kind
        else:
            options["type"] = str
        if field.default is not dataclasses.MISSING:
            options["default"] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            options["default"] = field.default_factory()
        else:
            options["required"] = True
        parser.add_argument(f"--{field.name}", **options)


def parse_dataclass(cls: type, argv: Sequence[str] | None, **parser_options):
    """An instance of ``cls`` from the command line (its ``__post_init__`` validates it)."""
    parser = argparse.ArgumentParser(**parser_options)
    add_dataclass_arguments(parser, cls)
    return cls(**vars(parser.parse_args(argv)))
