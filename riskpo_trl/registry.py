"""Named choices: one registry per choice, filled by a decorator and checked in one place (a leaf module).

Every choice a user makes by name (a risk profile, a bundling rule, a credit rule, a quantile source, a trainer, a
reward) lives in a :class:`Registry`. Registering is one decorator on the function (as verl's ``register_adv_est``)::

    BUNDLINGS = Registry("bundling")

    @BUNDLINGS.register("positional", help="completion j of every prompt of a group forms bundle j")
    def positional_bundles(...): ...

A name is checked once, by :meth:`Registry.check` (or on lookup with :meth:`Registry.get`), with a "did you mean"
hint; help texts and documentation lists are generated from the entries' ``help``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def _closest(name: str, choices: list[str], aliases: Mapping[str, str]) -> str | None:
    """``aliases[name]`` (another project's name for one of ``choices``), else the closest of ``choices``."""
    if name in aliases:
        return aliases[name]
    match = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return match[0] if match else None


def closest_name(name: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """' (did you mean X?)' for the closest of ``choices`` to a misspelled ``name``, or '' when none is close.
    ``aliases`` maps names other projects use (TRL's ``accuracy_reward``) to ours, and wins over spelling."""
    match = _closest(name, sorted(choices), aliases or {})
    return f" (did you mean {match}?)" if match else ""


def closest_names(names: Iterable[str], choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """' (did you mean X for Y, ...?)' for each of ``names`` close to one of ``choices`` (or one of ``aliases``, as in
    :func:`closest_name`), or '' when none is."""
    choices = sorted(choices)
    pairs = [(name, match) for name in names for match in [_closest(name, choices, aliases or {})] if match]
    return " (did you mean " + ", ".join(f"{match} for {name}" for name, match in pairs) + "?)" if pairs else ""


class Registry(Mapping[str, T], Generic[T]):
    """An ordered, read-only mapping ``name -> entry`` of the choices for the config field ``field``, with a one-line
    ``help`` per name. Entries are added by :meth:`register` (a decorator) or :meth:`add`."""

    def __init__(self, field: str) -> None:
        self.field = field
        self._entries: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def add(self, name: str, entry: T, help: str = "") -> T:
        if name in self._entries:
            raise ValueError(f"{self.field} {name!r} is registered twice.")
        self._entries[name] = entry
        self._help[name] = help
        return entry

    def register(self, name: str, help: str = "") -> Callable[[T], T]:
        """Decorator: register the decorated object as ``name``."""
        return lambda entry: self.add(name, entry, help)

    def check(self, name: Any) -> None:
        """Raise a ``ValueError`` naming the closest registered name and every choice, unless ``name`` is one."""
        if name not in self._entries:
            hint = closest_name(name, self._entries) if isinstance(name, str) else ""
            raise ValueError(f"{self.field}={name!r} is unknown{hint}; choose one of {list(self._entries)}.")

    def get(self, name: str) -> T:  # type: ignore[override]
        self.check(name)
        return self._entries[name]

    def help_of(self, name: str) -> str:
        return self._help[name]

    def describe(self) -> str:
        """``'a' (its help), 'b' (its help) or 'c' (its help)``: the choices in words, for help texts."""
        parts = [f"'{name}'" + (f" ({self._help[name]})" if self._help[name] else "") for name in self._entries]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.field!r}: {list(self._entries)})"
