"""Reading a small file the trainer trusts at start-up (a checkpoint's state, the run lock) without trusting what is
at its path: opened without following a link and without blocking, refused unless it is a regular file under a size
cap, then read whole. A symlink to ``/dev/zero``, a FIFO or a sparse file of gigabytes is refused by name instead of
being read until memory runs out or waited on for ever. A JSON file is read by `read_json_file` (that, UTF-8 text and
bounded nesting) and its fields by `json_field` (type-checked, refusals one short line naming file and field)."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


class UntrustedFileError(ValueError):
    """What is at a state file's path is not a regular file under its size cap; the message names it."""


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``; raises FileNotFoundError when nothing is there, and
    `UntrustedFileError` for anything but a regular file of at most ``max_bytes`` (also one that grows past it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:  # a symlink (ELOOP), or something this user cannot open
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):
            raise UntrustedFileError(f"{path} cannot be opened ({exc.strerror}): check its permissions.") from exc
        fd = None
    try:
        status = os.fstat(fd) if fd is not None else os.lstat(path)
        if not stat.S_ISREG(status.st_mode):
            kind = _KINDS.get(stat.S_IFMT(status.st_mode), "not a regular file")
            raise UntrustedFileError(f"{path} is {kind}, not a regular file: it is not read.")
        data = b""
        if status.st_size <= max_bytes:
            with os.fdopen(fd, "rb", closefd=False) as file:
                data = file.read(max_bytes + 1)
        if status.st_size > max_bytes or len(data) > max_bytes:
            raise UntrustedFileError(
                f"{path} holds {max(status.st_size, len(data))} bytes, over the {max_bytes} such a file can hold: "
                "it is not read."
            )
        return data
    finally:
        if fd is not None:
            os.close(fd)


# --- JSON files read at start-up: one reader for all (the lock, a checkpoint's trainer and RiskPO state)

MAX_NESTING = 64  # these files nest a few levels; json.loads recurses once per level
SHOWN_CHARS = 60  # a value shown in a refusal: enough to recognise it, short enough to keep the refusal one line
_SKELETON = bytes.maketrans(b"[{]}", b"(())")


class StateFileError(ValueError):
    """A start-up file is not what it should be; the one-line message names the file (and the field)."""


def shown(value: Any, quoted: bool = True) -> str:
    """``value`` for a refusal, cut short: a 400-digit number or a long list would bury the message. ``quoted``:
    a string as its repr, else as it is."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"an integer of {len(str(abs(value)))} digits"
    text = repr(value) if quoted or not isinstance(value, str) else value
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def decode_text(data: bytes, path: str) -> str:
    """``data`` as UTF-8, or a `StateFileError` naming ``path`` and the line of the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise StateFileError(f"{path}, line {line}: not UTF-8 text (byte {data[exc.start]:#04x}).") from None


def nesting_depth(data: bytes, limit: int) -> int:
    """The deepest ``[``/``{`` nesting of JSON ``data`` outside strings (an upper bound for invalid text), counted up
    to ``limit + 1``: C-speed passes over the brackets only, never a recursion."""
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    skeleton = b"".join(unescaped.split(b'"')[::2]).translate(_SKELETON, b"0123456789+-.eE,: \t\r\naflsnrtuNIiy")
    if b"(" * (limit + 1) in skeleton:
        return limit + 1
    depth = 0
    while skeleton and depth <= limit:
        reduced = skeleton.replace(b"()", b"")
        if reduced == skeleton:
            break
        skeleton, depth = reduced, depth + 1
    return depth + skeleton.count(b"(")


def read_json_file(path: str, max_bytes: int, hint: str = "") -> Any:
    """The JSON value in ``path``: a regular file (`read_regular_file`: no link followed, no blocking, at most
    ``max_bytes``), UTF-8, nested at most `MAX_NESTING` deep. Anything else is a `StateFileError` in one line naming
    the file, with ``hint`` (what to do) appended."""
    suffix = f" {hint}" if hint else ""
    try:
        data = read_regular_file(path, max_bytes)
    except UntrustedFileError as exc:
        raise StateFileError(f"{exc}{suffix}") from None
    text = decode_text(data, path)
    if nesting_depth(data, MAX_NESTING) > MAX_NESTING:
        raise StateFileError(f"{path} nests JSON more than {MAX_NESTING} levels deep: it is damaged.{suffix}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # not JSON, or a number of more digits than Python converts
        raise StateFileError(f"{path} is not valid JSON ({str(exc)[:120]}).{suffix}") from None


def json_field(holder: Any, name: str, kinds: type | tuple[type, ...], path: str, hint: str = "") -> Any:
    """``holder[name]`` checked to be of ``kinds`` (a bool is never a number here), or a `StateFileError` naming the
    file and the field; None when ``holder`` has no such field and None is among ``kinds``."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    value = holder.get(name) if isinstance(holder, dict) else None
    if value is None and type(None) in kinds:
        return None
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds):
        return value
    wanted = " or ".join(_KIND_NAMES.get(kind, kind.__name__) for kind in kinds if kind is not type(None))
    got = "missing" if not isinstance(holder, dict) or name not in holder else shown(value)
    raise StateFileError(f"{path}: field {name!r} must be {wanted}, got {got}.{f' {hint}' if hint else ''}")


_KIND_NAMES = {dict: "an object", list: "a list", str: "a string", int: "a whole number", float: "a number"}
