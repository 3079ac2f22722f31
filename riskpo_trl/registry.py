"""Named choices: one registry per choice, filled by a decorator and checked in one place (a leaf module).

Every choice a user makes by name (a risk profile, a bundling rule, a credit rule, a quantile source, a trainer, a
reward) lives in a :class:`Registry`. Registering is one decorator on the function (as verl's ``register_adv_est``)::

    BUNDLINGS = Registry("bundling")

    @BUNDLINGS.register("positional", help="completion j of every prompt of a group forms bundle j")
    def positional_bundles(...): ...

A name is checked once, by :meth:`Registry.check` (several: :meth:`Registry.check_all`; or on lookup with
:meth:`Registry.get`): every "unknown name" message of the package is written here, with a "did you mean" hint. Help
texts and documentation lists are generated from the entries' ``help``.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def closest(name: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str | None:
    """``aliases[name]`` (another project's name for one of ``choices``), else the closest of ``choices`` to a
    misspelled ``name``, else None. The package's one spelling matcher: every "did you mean" comes from here."""
    if aliases and name in aliases:
        return aliases[name]
    match = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(match: str | None) -> str:
    """' (did you mean X?)' for a ``match``, '' for None: the wording of every hint."""
    return f" (did you mean {match}?)" if match else ""


def closest_name(name: str, choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """' (did you mean X?)' for the closest of ``choices`` to a misspelled ``name``, or '' when none is close.
    ``aliases`` maps names other projects use (TRL's ``accuracy_reward``) to ours, and wins over spelling."""
    return did_you_mean(closest(name, choices, aliases))


def closest_names(names: Iterable[str], choices: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """' (did you mean X for Y, ...?)' for each of ``names`` close to one of ``choices`` (or one of ``aliases``, as in
    :func:`closest_name`), or '' when none is."""
    choices = sorted(choices)
    pairs = [(name, match) for name in names for match in [closest(name, choices, aliases)] if match]
    return " (did you mean " + ", ".join(f"{match} for {name}" for name, match in pairs) + "?)" if pairs else ""


def unimported_hint(module: str, entries: str) -> str:
    """' (...: `import module` first)' while ``module``, which registers ``entries`` from a higher layer, is not
    imported yet; '' once it is. A lower layer names such a module without importing it."""
    return "" if module in sys.modules else f" ({entries}: `import {module}` first)"


class Registry(Mapping[str, T], Generic[T]):
    """An ordered, read-only mapping ``name -> entry`` of the choices for the config field ``field``, with a one-line
    ``help`` per name. Entries are added by :meth:`register` (a decorator) or :meth:`add`."""

    def __init__(self, field: str, aliases: Mapping[str, str] | None = None) -> None:
        self.field = field
        self.aliases = dict(aliases or {})  # other projects' names for entries: hinted, not accepted
        self._entries: dict[str, T] = {}
        self._help: dict[str, str] = {}
        self._about: dict[str, dict[str, Any]] = {}

    def add(self, name: str, entry: T, help: str = "", **about: Any) -> T:
        """Register ``entry`` as ``name``; ``about``: what the entry says of itself beyond its help (its words on a
        model card, the properties its contract test checks), read back with :meth:`about`."""
        if name in self._entries:
            raise ValueError(f"{self.field} {name!r} is registered twice.")
        self._entries[name] = entry
        self._help[name] = help
        self._about[name] = dict(about)
        return entry

    def register(self, name: str, help: str = "", **about: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object as ``name`` (``about`` as in :meth:`add`)."""
        return lambda entry: self.add(name, entry, help, **about)

    def about(self, name: str) -> dict[str, Any]:
        return self._about[name]

    def check(self, name: Any, *, where: str = "", otherwise: str = "") -> None:
        """Raise a ``ValueError`` naming the closest registered name and every choice, unless ``name`` is one.
        ``where`` prefixes the message (``"pass_at_k: "``); ``otherwise`` follows the choices (``" or ..."``)."""
        self.check_all([name], where=where, otherwise=otherwise)

    def check_all(
        self, names: Iterable[Any], *, also: Iterable[str] = (), where: str = "", otherwise: str = ""
    ) -> None:
        """:meth:`check` for each of ``names`` in one message; ``also``: more names that count as known (another
        registry read under the same field)."""
        choices = [*self._entries, *(name for name in also if name not in self._entries)]
        unknown = [name for name in names if name not in choices]
        if not unknown:
            return
        if len(unknown) == 1:
            name = unknown[0]
            hint = closest_name(name, choices, self.aliases) if isinstance(name, str) else ""
            problem = f"{self.field}={name!r} is unknown{hint}"
        else:
            strings = [name for name in unknown if isinstance(name, str)]
            problem = f"{self.field} {unknown} are unknown{closest_names(strings, choices, self.aliases)}"
        raise ValueError(f"{where}{problem}; choose one of {choices}{otherwise}.")

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
