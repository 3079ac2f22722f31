"""Warnings raised while a config is built, attributed to the code that built it.

A warning from a config check would otherwise point at the dataclass's generated ``__init__`` (``<string>``), this
package's config modules or transformers' and TRL's argument parsing; :func:`caller_stacklevel` walks past them to the
user's ``RiskPOConfig(...)`` line, or the script that parsed a recipe.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import transformers
import trl

_HERE = os.path.dirname(os.path.abspath(__file__))
# The modules a config's construction passes through in this package.
CONFIG_MODULES = tuple(os.path.join(_HERE, name)
                       for name in ("config.py", "config_checks.py", "config_conversion.py", "caller_warnings.py"))


def caller_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning raised while a config is built to the code that built it: the
    user's ``RiskPOConfig(...)`` line (or the script that parsed a recipe), not the dataclass's generated
    ``__init__`` (``<string>``), this package's config modules or transformers' and TRL's argument handling."""
    skipped = (*CONFIG_MODULES, os.path.abspath(dataclasses.__file__))
    library_dirs = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                         for module in (transformers, trl))
    frame = sys._getframe(1)  # the function that calls warnings.warn: stacklevel 1
    level = 1
    while frame.f_back is not None:
        filename = frame.f_code.co_filename
        if not (filename == "<string>" or os.path.abspath(filename) in skipped
                or os.path.abspath(filename).startswith(library_dirs)):
            break
        frame = frame.f_back
        level += 1
    return level
