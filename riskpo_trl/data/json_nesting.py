"""How deeply a JSON file nests, found by a byte scan before any JSON reader sees the file; a leaf module.

The readers `datasets` uses recurse once per level: pyarrow's JSON reader overflows the C stack (a segmentation
fault, no message) on a row nested some 20,000 deep, and Python's ``json`` raises ``RecursionError`` near 1,000.
This scan counts brackets outside strings in fixed-size chunks, so it takes linear time and constant memory
whatever the file holds, and names the file and line of the first row nested too deeply.

It reads the bytes `datasets` reads: `datasets` picks a decompressor by the file's first bytes, not its name, so the
scan does too (gzip, bz2, xz, zstd with the ``zstandard`` package, and each member of a zip archive), up to
`MAX_DECOMPRESSED_BYTES`. A file it cannot read so is refused by name rather than passed unscanned.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import importlib.util
import lzma
import os
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from typing import BinaryIO

import numpy as np

# Arrow, which every `datasets` table is, holds at most 63 levels: pyarrow refuses a 64th with "Recursion level in
# ArrowSchema struct exceeded". So no file deeper than this could load anyway, and real rows come nowhere near it
# (a chat message list is 3 levels, a row of test cases a few more).
MAX_JSON_NESTING = 64

CHUNK_BYTES = 1 << 20
# What a compressed file may decompress to before the scan refuses it (a decompression bomb takes as long to scan).
MAX_DECOMPRESSED_BYTES = 32 << 30
_MAGIC_BYTES = 6
_STREAM_MAGIC = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ\x00": lzma.open}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_QUOTE, _BACKSLASH, _NEWLINE = ord('"'), ord("\\"), ord("\n")
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1
_SPECIAL = _DEPTH_STEP != 0
_SPECIAL[[_QUOTE, _BACKSLASH, _NEWLINE]] = True


class JsonNestingError(ValueError):
    """A JSON file nested deeper than :data:`MAX_JSON_NESTING`; the message names the file and line."""


def check_json_nesting(path: str | os.PathLike, limit: int = MAX_JSON_NESTING) -> None:
    """Raise :class:`JsonNestingError` naming ``path`` and the line where brackets (``[`` or ``{`` outside strings)
    first nest deeper than ``limit``. A file unchanged since its last check is not read again."""
    stat = os.stat(path)
    found = _deepest_line(os.path.abspath(path), stat.st_size, stat.st_mtime_ns, limit)
    if isinstance(found, str):
        raise JsonNestingError(f"Dataset file {path}: {found}")
    if found is not None:
        member, line = found
        where = f"{path} (archive member {member})" if member else str(path)
        raise JsonNestingError(
            f"Dataset file {where}, line {line}: JSON nested more than {limit} levels deep ([ or {{ inside one "
            "another), which `datasets` cannot load: Arrow holds at most 63 levels, and far deeper rows crash "
            "pyarrow's JSON reader. Fix or remove that row."
        )


@functools.lru_cache(maxsize=256)
def _deepest_line(path: str, size: int, mtime_ns: int, limit: int) -> tuple[str | None, int] | str | None:
    """(archive member or None, 1-based line) where the nesting first exceeds ``limit``; None if it never does; a
    string saying why the file cannot be scanned (``size``, ``mtime_ns``: the cache key)."""
    with ExitStack() as stack:
        try:
            for member, stream in _decompressed(stack, path):
                line = _deepest_line_of(stream, limit)
                if isinstance(line, str) or line is not None:
                    return line if isinstance(line, str) else (member, line)
        except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile) as exc:
            return f"it cannot be decompressed ({type(exc).__name__}: {exc}); fix or replace the file."
    return None


def _decompressed(stack: ExitStack, path: str) -> Iterator[tuple[str | None, BinaryIO]]:
    """The streams `datasets` would read from ``path``, by its first bytes: (archive member or None, stream)."""
    with open(path, "rb") as probe:
        magic = probe.read(_MAGIC_BYTES)
    if magic.startswith(_ZIP_MAGIC):
        archive = stack.enter_context(zipfile.ZipFile(path))
        for info in archive.infolist():
            if not info.is_dir():
                with archive.open(info) as member:
                    head = member.read(_MAGIC_BYTES)
                if _is_compressed(head):
                    raise OSError(f"archive member {info.filename} is itself compressed; unpack it first")
                yield info.filename, stack.enter_context(archive.open(info))
        return
    for prefix, opener in _STREAM_MAGIC.items():
        if magic.startswith(prefix):
            yield None, stack.enter_context(opener(path, "rb"))
            return
    if magic.startswith(_ZSTD_MAGIC):
        if importlib.util.find_spec("zstandard") is None:
            raise OSError("it is zstd-compressed and the zstandard package is not installed: pip install zstandard")
        import zstandard

        yield None, stack.enter_context(zstandard.open(path, "rb"))
        return
    yield None, stack.enter_context(open(path, "rb"))


def _is_compressed(head: bytes) -> bool:
    return head.startswith((*_STREAM_MAGIC, _ZSTD_MAGIC, *_ZIP_MAGIC))


def _deepest_line_of(file: BinaryIO, limit: int) -> int | str | None:
    """The 1-based line where the nesting first exceeds ``limit``, None if it never does, or why the stream is
    refused (over `MAX_DECOMPRESSED_BYTES`)."""
    depth, in_string, backslash_run, lines_before, total = 0, False, 0, 0, 0
    while chunk := file.read(CHUNK_BYTES):
        total += len(chunk)
        if total > MAX_DECOMPRESSED_BYTES:
            return (
                f"it decompresses to more than {MAX_DECOMPRESSED_BYTES >> 30} GiB, which the nesting check does not "
                "scan; decompress it and give the plain file."
            )
        data = np.frombuffer(chunk, dtype=np.uint8)
        # Only the bytes that matter, with their positions: brackets, quotes, backslashes, newlines.
        positions = np.flatnonzero(_SPECIAL[data]).astype(np.int32)
        if positions.size:
            found = data[positions]
            inside = _inside_strings(found, positions, in_string, backslash_run)
            depths = depth + np.cumsum(np.where(inside, 0, _DEPTH_STEP[found]), dtype=np.int32)
            if depths.min() < 0:  # stray closing brackets (invalid JSON): depth stays at 0, as if they were not
                depths -= np.minimum(np.minimum.accumulate(depths), 0)
            too_deep = np.flatnonzero(depths > limit)
            if too_deep.size:
                return lines_before + chunk.count(b"\n", 0, int(positions[too_deep[0]])) + 1
            depth, in_string = int(depths[-1]), bool(inside[-1])
        trailing = len(chunk) - len(chunk.rstrip(b"\\"))
        backslash_run = backslash_run + trailing if trailing == len(chunk) else trailing
        lines_before += chunk.count(b"\n")
    return None


def _inside_strings(found: np.ndarray, positions: np.ndarray, in_string: bool, backslash_run: int) -> np.ndarray:
    """Which of the ``found`` bytes lie inside a string: after an odd number of unescaped quotes since the last
    newline (JSON strings hold no raw newline, and line-based readers start each line afresh)."""
    quotes = np.cumsum(_unescaped_quotes(found, positions, backslash_run), dtype=np.int32) + int(in_string)
    newline = found == _NEWLINE
    if (quotes[newline] % 2).any():  # a string open at a line's end (invalid JSON): the next line starts outside
        quotes -= np.maximum.accumulate(np.where(newline, quotes, 0))
    return (quotes % 2 == 1) & ~newline


def _unescaped_quotes(found: np.ndarray, positions: np.ndarray, backslash_run: int) -> np.ndarray:
    """Which of the ``found`` bytes are ``"`` not escaped: not right after an odd run of backslashes
    (``backslash_run``: the run that ended the previous chunk; only its parity matters)."""
    quote = found == _QUOTE
    carried = backslash_run % 2
    if carried:  # the previous chunk's odd run, as one backslash just before this chunk
        found = np.concatenate([np.array([_BACKSLASH], dtype=np.uint8), found])
        positions = np.concatenate([np.array([-1], dtype=np.int32), positions])
    backslash = found == _BACKSLASH
    adjacent = np.diff(positions) == 1  # adjacent[i]: found[i + 1] directly follows found[i]
    after_backslash = backslash[:-1] & adjacent
    if not (after_backslash & (found[1:] == _QUOTE)).any():
        return quote
    index = np.arange(found.size, dtype=np.int32)
    run_start = np.ones(found.size, dtype=bool)
    run_start[1:] = ~after_backslash
    run_start = np.maximum.accumulate(np.where(backslash & run_start, index, 0))
    odd_run_ends = backslash & ((index - run_start) % 2 == 0)  # a backslash ending a run here escapes what follows
    escaped = np.zeros(found.size, dtype=bool)
    escaped[1:] = odd_run_ends[:-1] & adjacent
    return quote & ~escaped[carried:]
