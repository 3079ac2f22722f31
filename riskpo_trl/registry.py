"""Named choices: one registry per choice, filled by a decorator and checked in one place (a leaf module).

Every choice a user makes by name (a risk profile, a bundling rule, a credit rule, a quantile source, a trainer, a
reward) lives in a :class:`Registry`. Registering is one decorator on the function (as verl's ``register_adv_est``)::

    BUNDLINGS = Registry("bundling")

    @BUNDLINGS.register("positional", help="completion j of every prompt of a group forms bundle j")
    def positional_bundles(...): ...

A name is checked once, by :meth:`Registry.check` (several: :meth:`Registry.check_all`; or on lookup with
:meth:`Registry.get`): every "unknown name" message of the package is written here, with a "did you mean" hint. Help
texts and documentation lists are generated from the entries' ``help``.

A registry declares what each entry must say of itself beyond its help (its ``spec``: one :class:`Says` per key, such
as a baseline's words on a model card or the properties its contract test checks). Registering an entry that lacks
a required key, gives one of the wrong type, or gives one the spec does not know raises :class:`RegistrationError`
at once, naming the key and what it means. Entries registered inside a :func:`temporary_entries` block, in any
registry, are removed when it ends (:meth:`Registry.temporarily`: one entry), so a test or a plug-in's trial leaves
nothing behind and patches no private field.
"""

from __future__ import annotations

import contextlib
import difflib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Says:
    """One key an entry of a registry says of itself: its type (``kind``), what it means, whether every entry must
    say it, and the keys that must come with it (``with_keys``: a scaling that names the quantile source it needs
    says why too)."""

    kind: type | tuple[type, ...]
    meaning: str
    required: bool = True
    with_keys: tuple[str, ...] = ()
    choices: tuple[Any, ...] = ()  # the values allowed, when only some are


class RegistrationError(TypeError):
    """An entry registered without what its registry's spec requires, or with what the spec does not know."""


@dataclass
class _UndoScope:
    undo: list[Callable[[], None]]
    imports: int  # imports running when the block began


_UNDO_SCOPES: list[_UndoScope] = []


def _imports_running() -> int:
    """How many imports are running in this thread (the import system's frames on the stack)."""
    frame, count = sys._getframe(1), 0
    while frame is not None:
        count += frame.f_code.co_filename.startswith("<frozen importlib")
        frame = frame.f_back
    return count


@contextlib.contextmanager
def temporary_entries() -> Iterator[None]:
    """Every entry registered inside the block, in any registry (and what its registration adds elsewhere, such as a
    profile's formula in ``ADVANTAGE_SCALINGS``), is removed when the block ends, even on an error. An entry that a
    module registers while it is first imported inside the block stays: the module stays imported."""
    scope = _UndoScope([], _imports_running())
    _UNDO_SCOPES.append(scope)
    try:
        yield
    finally:
        _UNDO_SCOPES.remove(scope)
        for callback in reversed(scope.undo):
            callback()


def undo_on_exit(callback: Callable[[], None]) -> None:
    """For a registration that changes more than one :class:`Registry`: ``callback`` undoes the rest when the
    innermost :func:`temporary_entries` block ends (outside one, or from a module being imported, a registration is
    for good)."""
    if _UNDO_SCOPES and _imports_running() <= _UNDO_SCOPES[-1].imports:
        _UNDO_SCOPES[-1].undo.append(callback)


class Registry(Mapping[str, T], Generic[T]):
    """An ordered, read-only mapping ``name -> entry`` of the choices for the config field ``field``, with a one-line
    ``help`` per name. Entries are added by :meth:`register` (a decorator) or :meth:`add`; ``spec`` says what each
    entry must say of itself (``about``), checked when it is registered."""

    def __init__(
        self,
        field: str,
        aliases: Mapping[str, str] | None = None,
        spec: Mapping[str, Says] | None = None,
        needs_help: bool = False,
    ) -> None:
        self.field = field
        self.aliases = dict(aliases or {})  # other projects' names for entries: hinted, not accepted
        self.spec = dict(spec or {})
        self.needs_help = needs_help  # every entry has a help line (the choice is listed with it)
        self._entries: dict[str, T] = {}
        self._help: dict[str, str] = {}
        self._about: dict[str, dict[str, Any]] = {}

    def add(self, name: str, entry: T, help: str = "", **about: Any) -> T:
        """Register ``entry`` as ``name``; ``about``: what the entry says of itself beyond its help (its words on a
        model card, the properties its contract test checks: the registry's ``spec``), read back with
        :meth:`about`. Raises :class:`RegistrationError` when ``about`` does not fit the spec."""
        if name in self._entries:
            raise ValueError(f"{self.field} {name!r} is registered twice.")
        self.check_about(name, about, help)
        self._entries[name] = entry
        self._help[name] = help
        self._about[name] = dict(about)
        undo_on_exit(lambda: self._remove(name, entry))
        return entry

    def check_about(self, name: str, about: Mapping[str, Any], help: str = "") -> None:
        """Raise :class:`RegistrationError` naming what ``about`` lacks, gives wrongly or gives unknown, or the missing
        ``help`` of a registry whose entries are listed with theirs."""
        where = f"{self.field} {name!r} is registered"
        unknown = [key for key in about if key not in self.spec]
        if unknown:
            known = ", ".join(self.spec) or "nothing beyond its help"
            hint = closest_names(unknown, self.spec)
            raise RegistrationError(
                f"{where} with {unknown}{hint}, which a {self.field} entry does not say ({known})."
            )
        needed = {key for key, says in self.spec.items() if says.required}
        needed |= {other for key in about for other in self.spec[key].with_keys}
        for key in self.spec:  # in the spec's order
            says = self.spec[key]
            if key in needed and key not in about:
                raise RegistrationError(f"{where} without {key!r} ({says.meaning}); say it: {key}=...")
            if key in about and not isinstance(about[key], says.kind):
                raise RegistrationError(
                    f"{where} with {key}={about[key]!r}; {key} is {says.meaning}, a {_kind_name(says.kind)}."
                )
            if key in about and says.choices and about[key] not in says.choices:
                raise RegistrationError(f"{where} with {key}={about[key]!r}; {key} is one of {list(says.choices)}.")
        if self.needs_help and not help:
            raise RegistrationError(f"{where} without its help, the line that lists it; say it: help=...")

    @contextlib.contextmanager
    def temporarily(self, name: str, entry: T, help: str = "", **about: Any) -> Iterator[T]:
        """``entry`` registered as ``name`` (as :meth:`add`) for the block, then removed."""
        with temporary_entries():
            yield self.add(name, entry, help, **about)

    def _remove(self, name: str, entry: T) -> None:
        if self._entries.get(name) is entry:
            del self._entries[name], self._help[name], self._about[name]

    def register(self, name: str, help: str = "", **about: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object as ``name`` (``about`` as in :meth:`add`)."""
        return lambda entry: self.add(name, entry, help, **about)

    def about(self, name: str) -> dict[str, Any]:
        """What the entry ``name`` says of itself (its ``about``; an optional key it leaves out is absent)."""
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


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)
