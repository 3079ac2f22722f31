"""The private API of TRL, transformers, accelerate and vLLM that the package touches, found by reading its code.

`scan` walks every module's syntax tree for each private (single-underscore) name the package overrides, calls,
reads or writes that belongs to one of those libraries, and the test fails when one is missing from
`riskpo_trl.compat.private_api`'s lists, whose own tests (tests/test_compat.py) then check it in every supported
release: a method's parameters (`PRIVATE_METHODS`), a class attribute's presence (`PRIVATE_CLASS_ATTRIBUTES`), a
built object's attribute (`PRIVATE_ATTRIBUTES`). A name counts as the library's when

- a class of the package defines it and a library class it is combined with defines it too (an override; mixins are
  combined with the classes that list them as bases, and the package's trainers of `TRAINERS`);
- it is read on ``self`` or ``super()`` in such a class and the package's side of the class neither defines it nor
  sets it in ``__init__`` (so TRL's ``_metrics``, set in GRPOTrainer's ``__init__``, counts);
- it is read on a library class or module by name (``Trainer._save_checkpoint``);
- it is read on any other object (``trainer._save_checkpoint``) and the package defines no such name.

The last rule is the scan's blind spot: a library private read on an object of unknown type under a name the package
also uses for its own is taken as the package's. The standard library's privates are out of scope (listed below
where the last rule would otherwise flag them). A module that cannot be imported here (the vLLM server without vLLM)
is read by the same rules without its classes' library bases.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import shutil
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from riskpo_trl.compat import private_api

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "riskpo_trl"
LIBRARIES = ("trl", "transformers", "accelerate", "vllm")
SETUP_METHODS = ("__init__", "__post_init__", "__new__")
# Standard-library privates read on objects of unknown type, which the last rule would otherwise take for a library's.
STANDARD_LIBRARY_PRIVATES = {
    "_actions": "argparse: a parser's actions (scripts read the options they declare)",
    "_get_formatter": "argparse: the parser's help formatter",
    "_replace": "a namedtuple's copy with fields replaced (torch's load result)",
}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def from_library(obj: object) -> bool:
    module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] in LIBRARIES


def module_name(path: Path, package_dir: Path) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class ClassSource:
    """What a class of the package declares itself: methods and class attributes, and what its set-up assigns."""

    module: str
    qualname: str
    declared: frozenset[str]
    set_up: frozenset[str]


@dataclass(frozen=True)
class Reference:
    module: str
    line: int
    name: str
    receiver: str  # "self", "name:<identifier>" or "other"
    in_class: str | None  # the qualname of the innermost class


@dataclass(frozen=True)
class PrivateUse:
    """One use of a library's private name: where, what, and the library classes it may belong to (none known: an
    attribute of a built object)."""

    where: str
    name: str
    how: str  # "overrides" or "uses"
    owners: tuple[type, ...]

    def __str__(self) -> str:
        owners = ", ".join(f"{owner.__module__}.{owner.__qualname__}" for owner in self.owners) or "a library object"
        return f"{self.where}: {self.how} {self.name} of {owners}"


def read_module(name: str, source: str) -> tuple[list[ClassSource], list[Reference]]:
    """The classes and the private references of one module's source."""
    classes, references = [], []

    def visit(node: ast.AST, qualname: str | None, receiver_names: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                inner = f"{qualname}.{child.name}" if qualname else child.name
                classes.append(class_source(name, inner, child))
                visit(child, inner, ())
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                arguments = child.args.posonlyargs + child.args.args
                own = (arguments[0].arg,) if qualname and arguments and not receiver_names else receiver_names
                visit(child, qualname, own)
            else:
                reference = private_reference(name, child, qualname, receiver_names)
                if reference is not None:
                    references.append(reference)
                visit(child, qualname, receiver_names)

    visit(ast.parse(source), None, ())
    return classes, references


def class_source(module: str, qualname: str, node: ast.ClassDef) -> ClassSource:
    declared, set_up = set(), set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
            declared.add(item.name)
            if item.name in SETUP_METHODS:
                set_up |= {
                    target.attr
                    for sub in ast.walk(item)
                    if isinstance(sub, ast.Assign | ast.AnnAssign | ast.AugAssign)
                    for assigned in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
                    for target in ast.walk(assigned)  # ``self._a, self._b = ...`` too
                    if isinstance(target, ast.Attribute)
                }
        elif isinstance(item, ast.Assign):
            declared |= {target.id for target in item.targets if isinstance(target, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            declared.add(item.target.id)
    return ClassSource(module, qualname, frozenset(declared), frozenset(set_up))


def private_reference(module: str, node: ast.AST, qualname: str | None, receivers: tuple[str, ...]):
    """A private attribute read or written (``x._name``, ``getattr(x, "_name")``), or None."""
    if isinstance(node, ast.Attribute) and is_private(node.attr):
        target, name = node.value, node.attr
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr", "setattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
        and is_private(node.args[1].value)
    ):
        target, name = node.args[0], node.args[1].value
    else:
        return None
    if (
        isinstance(target, ast.Name)
        and target.id in receivers
        or isinstance(target, ast.Call)
        and isinstance(target.func, ast.Name)
        and target.func.id == "super"
    ):
        receiver = "self"
    elif isinstance(target, ast.Name):
        receiver = f"name:{target.id}"
    else:
        receiver = "other"
    return Reference(module, node.lineno, name, receiver, qualname)


def runtime_object(module: str, qualname: str | None = None):
    """The imported module (or its class ``qualname``), or None where it cannot be imported here."""
    try:
        obj = importlib.import_module(module)
    except ImportError:
        return None
    for part in (qualname or "").split(".") if qualname else ():
        obj = getattr(obj, part, None)
    return obj


def composed_classes() -> list[type]:
    """The package's trainers of `TRAINERS`, whose bases are mixins of the package (the baselines are TRL's own
    classes, unchanged: none of their code is the package's)."""
    from riskpo_trl.trainer.registry import TRAINERS, get_trainer_classes

    trainers = [get_trainer_classes(name)[1] for name in TRAINERS]
    return [cls for cls in trainers if cls.__module__.startswith("riskpo_trl")]


def scan(sources: dict[str, str]) -> list[PrivateUse]:
    """Every private name of TRL, transformers, accelerate or vLLM used by ``sources`` (module name -> source text),
    read with the runtime classes of the installed package (the sources' classes by module and name)."""
    classes, references = [], []
    for name, source in sources.items():
        found_classes, found_references = read_module(name, source)
        classes += found_classes
        references += found_references
    by_object: dict[type, list[ClassSource]] = {}
    for source in classes:
        obj = runtime_object(source.module, source.qualname)
        if isinstance(obj, type):
            by_object.setdefault(obj, []).append(source)
    everything = [*by_object, *composed_classes()]

    def context(cls: type) -> list[type]:
        """The library classes ``cls`` is combined with, nearest first."""
        found = []
        for composed in everything:
            if cls in composed.__mro__:
                found += [base for base in composed.__mro__ if from_library(base) and base not in found]
        return found

    def own(cls: type | None, source: ClassSource | None, name: str) -> bool:
        sources = [s for base in cls.__mro__ for s in by_object.get(base, ())] if cls is not None else [source]
        return any(name in s.declared or name in s.set_up for s in sources)

    defined_anywhere = {name for source in classes for name in source.declared | source.set_up}
    for source in sources.values():
        tree = ast.parse(source)
        defined_anywhere |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    library_classes = {base for cls in everything for base in context(cls)}
    uses = []
    for cls in {*by_object, *composed_classes()}:
        for name in vars(cls):
            owners = tuple(base for base in context(cls) if is_private(name) and name in vars(base))
            if owners:
                uses.append(PrivateUse(f"{cls.__module__}.{cls.__qualname__}", name, "overrides", owners[:1]))
    sources_by_name = {(s.module, s.qualname): s for s in classes}
    for ref in references:
        where = f"{ref.module}:{ref.line}"
        if ref.receiver == "self" and ref.in_class is not None:
            source = sources_by_name[(ref.module, ref.in_class)]
            cls = runtime_object(ref.module, ref.in_class)
            cls = cls if isinstance(cls, type) else None
            if own(cls, source, ref.name):
                continue
            near = context(cls) if cls is not None else []
            if cls is not None and not near:
                continue  # a class combined with no library class: its private names are its own
            owners = tuple(base for base in near if hasattr(base, ref.name)) or tuple(near)
            uses.append(PrivateUse(where, ref.name, "uses", owners[:1]))
        elif ref.receiver.startswith("name:"):
            module = runtime_object(ref.module)
            bound = getattr(module, ref.receiver[5:], None) if module is not None else None
            if bound is not None and from_library(bound):
                owner = bound if isinstance(bound, type) else type(bound)
                uses.append(PrivateUse(where, ref.name, "uses", (owner,) if isinstance(bound, type) else ()))
            elif bound is None and ref.name not in defined_anywhere:
                uses.append(unknown_receiver_use(where, ref.name, library_classes))
        elif ref.name not in defined_anywhere:
            uses.append(unknown_receiver_use(where, ref.name, library_classes))
    return [use for use in uses if use.name not in STANDARD_LIBRARY_PRIVATES or use.owners]


def unknown_receiver_use(where: str, name: str, library_classes: set[type]) -> PrivateUse:
    owners = [cls for cls in library_classes if hasattr(cls, name)]
    # the class that defines it, not each subclass that inherits it
    defining = [cls for cls in owners if not any(other is not cls and issubclass(cls, other) for other in owners)]
    return PrivateUse(where, name, "uses", tuple(sorted(defining, key=lambda cls: cls.__qualname__))[:1])


# --- the lists of compat.private_api ---------------------------------------------------------------------------


def listed_owner(owner: str) -> type | None:
    module, _, name = owner.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None


def related(a: type, b: type) -> bool:
    return issubclass(a, b) or issubclass(b, a)


def unlisted(uses: list[PrivateUse]) -> list[str]:
    """The uses whose name is missing from the list compat.private_api keeps for its kind (a method:
    PRIVATE_METHODS, whose signature test then covers it; a class attribute: PRIVATE_CLASS_ATTRIBUTES; a built
    object's attribute: PRIVATE_ATTRIBUTES), under an owner related to the one found."""
    lists = {
        "method": private_api.PRIVATE_METHODS,
        "class attribute": private_api.PRIVATE_CLASS_ATTRIBUTES,
        "attribute": private_api.PRIVATE_ATTRIBUTES,
    }
    missing = []
    for use in uses:
        owner = use.owners[0] if use.owners else None
        kind = "attribute"
        if owner is not None and hasattr(owner, use.name):
            kind = "method" if callable(inspect.getattr_static(owner, use.name)) else "class attribute"
        entries = [
            (listed_owner(name), names) for name, names in lists[kind].items() if use.name in names
        ]  # an owner not importable here (vLLM) matches by name
        if not any(owner is None or listed is None or related(owner, listed) for listed, _ in entries):
            missing.append(f"{use} (list it in compat.private_api.{kind_list(kind)})")
    return missing


def kind_list(kind: str) -> str:
    return {"method": "PRIVATE_METHODS", "class attribute": "PRIVATE_CLASS_ATTRIBUTES"}.get(kind, "PRIVATE_ATTRIBUTES")


def package_sources(package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    return {module_name(path, package_dir): path.read_text() for path in sorted(package_dir.rglob("*.py"))}


# --- the tests -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package_uses() -> list[PrivateUse]:
    return scan(package_sources())


def test_every_private_name_the_package_uses_is_listed_in_compat(package_uses):
    assert unlisted(package_uses) == []


def test_the_scan_finds_the_known_seams(package_uses):
    """What the docs' seam table names, found without a list: overrides, a method of a trainer object wrapped and
    called (the job layer's ``_save_checkpoint``, which preemption also calls), attributes set by TRL's constructor, a
    class attribute and a vLLM client's private method."""
    found = {(use.name, use.how) for use in package_uses}
    assert {
        ("_calculate_rewards", "overrides"),
        ("_save_checkpoint", "uses"),
        ("_metrics", "uses"),
        ("_buffered_inputs", "uses"),
        ("_tag_names", "overrides"),
        ("_post", "overrides"),
    } <= found


def test_every_listed_name_is_used(package_uses):
    """A listed name the package no longer uses is stale (the list says what the package relies on)."""
    used = {use.name for use in package_uses}
    listed = {
        name
        for table in (
            private_api.PRIVATE_METHODS,
            private_api.PRIVATE_CLASS_ATTRIBUTES,
            private_api.PRIVATE_ATTRIBUTES,
        )
        for names in table.values()
        for name in names
    }
    assert sorted(listed - used) == []


PLANTED = {
    # an unlisted call on an object of unknown type, in the module of the lists themselves
    "riskpo_trl.compat.private_api": (
        "\n\ndef planted(trainer):\n    trainer._maybe_log_save_evaluate(None, None, None, None, None, None, None)\n",
        "_maybe_log_save_evaluate",
    ),
    # an unlisted transformers method reached through super() in a mixin with no library base of its own
    "riskpo_trl.trainer.token_mean": (
        "\n\nclass TokenMeanLossMixin(TokenMeanLossMixin):\n    def planted(self):\n"
        "        return super()._get_train_sampler()\n",
        "_get_train_sampler",
    ),
}


@pytest.mark.parametrize("module", list(PLANTED))
def test_the_scan_fails_on_a_planted_unlisted_private_use(tmp_path, module):
    planted, name = PLANTED[module]
    relative = Path(*module.split(".")[1:]).with_suffix(".py")
    copy = tmp_path / "riskpo_trl"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / relative, "a") as source:
        source.write(planted)
    sources = package_sources(copy)
    assert module in sources and planted in sources[module]
    problems = unlisted(scan(sources))
    assert [problem for problem in problems if f" {name} of " in problem] != [], problems
    assert all(f" {name} of " in problem for problem in problems), problems


def test_a_private_name_set_in_the_packages_own_constructor_is_its_own():
    classes, references = read_module(
        "example",
        "class Mixin:\n    def __init__(self):\n        self._mine = 1\n    def f(self):\n"
        "        return self._mine, self._theirs\n",
    )
    assert classes[0].set_up == {"_mine"}
    assert {(ref.name, ref.receiver) for ref in references} == {("_mine", "self"), ("_theirs", "self")}
