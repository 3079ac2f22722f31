"""Lazy public names for the package's ``__init__`` files (a leaf module, standard library only).

Each ``__init__`` lists its public names by home module in one map, imports the same names under ``TYPE_CHECKING``
(what type checkers and IDEs read, as TRL's ``__init__`` does), and gets ``__getattr__``, ``__dir__`` and ``__all__``
from :func:`lazy_names`: a name's module is imported on first use only, so ``riskpo-train --help`` and the code
sandbox start without torch or TRL. ``tests/test_public_api.py`` keeps each map and its ``TYPE_CHECKING`` block equal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any


def lazy_names(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` whose public names are ``exports``: home module (relative
    to ``package``) -> the names it gives."""
    homes = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f".{homes[name]}", package), name)
        setattr(sys.modules[package], name, value)  # later uses skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__, sorted(homes)
