"""How deeply a JSON file nests, found by a byte scan before any JSON reader sees the file; a leaf module.

The readers `datasets` uses recurse once per level: pyarrow's JSON reader overflows the C stack (a segmentation
fault, no message) on a row nested some 20,000 deep, and Python's ``json`` raises ``RecursionError`` near 1,000.
This scan counts brackets outside strings in fixed-size chunks, so it takes linear time and constant memory
whatever the file holds, and names the file and line of the first row nested too deeply.

It reads the bytes `datasets` reads: `datasets` picks an extractor by the file's content, not its name
(``datasets.utils.extract.Extractor.infer_extractor_format``), and so does `archive_format`, with the same rules in the
same order: tar (``tarfile.is_tarfile``, compressed tars included), gzip, zip (by a ``PK\\x03\\x04``, ``PK\\x05\\x06``
or ``PK\\x07\\x08`` prefix or, failing those, an end-of-central-directory record at the end of the file, so a JSON
lines file with a zip appended is a zip), xz, rar, zstd, bz2, 7z, lz4. Tar and zip members are scanned one at a
time, each closed before the next opens, so the scan's memory does not grow with the number of members; a member
that is itself compressed, and the formats it cannot follow (rar, 7z, lz4, zstd without the ``zstandard`` package),
are refused by name rather than passed unscanned. Its CPU is bounded per input byte: it decompresses at most
`MAX_EXPANSION_RATIO` times the file's size plus `EXPANSION_SLACK_BYTES` (and never more than
`MAX_DECOMPRESSED_BYTES`), and refuses a file that expands further, so a decompression bomb is refused after a bounded
amount of work.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import importlib.util
import lzma
import os
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from typing import BinaryIO

import numpy as np

# Arrow, which every `datasets` table is, holds at most 63 levels: pyarrow refuses a 64th with "Recursion level in
# ArrowSchema struct exceeded". So no file deeper than this could load anyway, and real rows come nowhere near it
# (a chat message list is 3 levels, a row of test cases a few more).
MAX_JSON_NESTING = 64

CHUNK_BYTES = 1 << 20
# What a compressed file may decompress to before the scan refuses it (a decompression bomb takes as long to scan):
# at most this many times its size on disk plus the slack (JSON text compresses some 3-20 times with gzip, bz2 or
# xz; a file of repeated rows may reach a few dozen), and never more than the cap.
MAX_EXPANSION_RATIO = 200
EXPANSION_SLACK_BYTES = 64 << 20
MAX_DECOMPRESSED_BYTES = 32 << 30
_MAGIC_BYTES = 8
# Each format `datasets` extracts, in the order its Extractor tries them, with its magic numbers (tar has none).
_EXTRACTOR_MAGIC = {
    "gzip": (b"\x1f\x8b",),
    "zip": (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"),
    "xz": (b"\xfd7zXZ\x00",),
    "rar": (b"Rar!\x1a\x07\x00", b"Rar!\x1a\x07\x01\x00"),
    "zstd": (b"\x28\xb5\x2f\xfd",),
    "bz2": (b"BZh",),
    "7z": (b"7z\xbc\xaf\x27\x1c",),
    "lz4": (b"\x04\x22\x4d\x18",),
}
_STREAM_OPENERS = {"gzip": gzip.GzipFile, "bz2": bz2.BZ2File, "xz": lzma.LZMAFile}
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
    budget = _Budget(size)
    try:
        for member, opener in _streams(path):
            with opener() as stream:
                head = stream.read(_MAGIC_BYTES)
                if member is not None and _magic_format(head) is not None:
                    return f"its archive member {member} is itself compressed; unpack it first."
                line = _deepest_line_of(stream, limit, budget, head)
            if isinstance(line, str) or line is not None:
                return line if isinstance(line, str) else (member, line)
    except _Unfollowable as exc:
        return f"{exc}; the nesting check cannot read it, so it is refused: give the plain file."
    except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile, tarfile.TarError, ValueError) as exc:
        return f"it cannot be decompressed ({type(exc).__name__}: {exc}); fix or replace the file."
    return None


class _Unfollowable(Exception):
    """A format `datasets` would extract that this scan cannot read."""


class _Budget:
    """The decompressed bytes a file's scan may read: `MAX_EXPANSION_RATIO` x its size plus the slack, capped."""

    def __init__(self, size: int):
        self.size = size
        self.left = min(MAX_DECOMPRESSED_BYTES, EXPANSION_SLACK_BYTES + MAX_EXPANSION_RATIO * size)

    def spend(self, count: int) -> str | None:
        self.left -= count
        if self.left >= 0:
            return None
        return (
            f"it expands to more than {MAX_EXPANSION_RATIO} times its {self.size:,} bytes (plus "
            f"{EXPANSION_SLACK_BYTES >> 20} MiB), past what the nesting check decompresses (a decompression bomb, or "
            "data that compresses unusually well); decompress it and give the plain file."
        )


def archive_format(path: str) -> str | None:
    """The extractor `datasets` picks for ``path`` (``Extractor.infer_extractor_format``, the same rules in its
    order), or None for a file it reads as it is."""
    if tarfile.is_tarfile(path):
        return "tar"
    with open(path, "rb") as probe:
        magic = probe.read(_MAGIC_BYTES)
    found = _magic_format(magic)
    if found == "gzip":
        return found
    if found == "zip" or _zip_by_end_record(path):  # tried before the later magic numbers, as `datasets` does
        return "zip"
    return found


def _magic_format(magic: bytes) -> str | None:
    for name, prefixes in _EXTRACTOR_MAGIC.items():
        if magic.startswith(prefixes):
            return name
    return None


def _zip_by_end_record(path: str) -> bool:
    """`datasets`' ZipExtractor test when no magic number matched: an end-of-central-directory record at the end of
    the file whose central directory is where it says (cpython's stricter `is_zipfile`, as `datasets` has it)."""
    import struct
    from zipfile import (  # the same private helpers `datasets` uses
        _CD_SIGNATURE,
        _ECD_DISK_NUMBER,
        _ECD_DISK_START,
        _ECD_ENTRIES_TOTAL,
        _ECD_OFFSET,
        _ECD_SIZE,
        _EndRecData,
        sizeCentralDir,
        stringCentralDir,
        structCentralDir,
    )

    try:
        with open(path, "rb") as file:
            end = _EndRecData(file)
            if not end:
                return False
            if end[_ECD_ENTRIES_TOTAL] == 0 and end[_ECD_SIZE] == 0 and end[_ECD_OFFSET] == 0:
                return True
            if end[_ECD_DISK_NUMBER] != end[_ECD_DISK_START]:
                return False
            file.seek(end[_ECD_OFFSET])
            if file.tell() != end[_ECD_OFFSET] or end[_ECD_SIZE] < sizeCentralDir:
                return False
            data = file.read(sizeCentralDir)
            if len(data) != sizeCentralDir:
                return False
            return struct.unpack(structCentralDir, data)[_CD_SIGNATURE] == stringCentralDir
    except (OSError, struct.error):
        return False


def _streams(path: str) -> Iterator[tuple[str | None, Callable[[], BinaryIO]]]:
    """What `datasets` reads from ``path``: (archive member or None, an opener of its stream), one member open at a
    time (the caller closes each before asking for the next)."""
    found = archive_format(path)
    if found == "zip":
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    yield info.filename, functools.partial(archive.open, info)
    elif found == "tar":
        with tarfile.open(path, "r|*") as archive:  # a stream: members in order, none kept
            for info in archive:
                if info.isfile():
                    yield info.name, functools.partial(_opened, archive.extractfile(info))
    elif found in _STREAM_OPENERS:
        yield None, functools.partial(_STREAM_OPENERS[found], path, "rb")
    elif found == "zstd":
        if importlib.util.find_spec("zstandard") is None:
            raise _Unfollowable(
                "it is zstd-compressed and the zstandard package is not installed (pip install zstandard)"
            )
        import zstandard

        yield None, functools.partial(zstandard.open, path, "rb")
    elif found is not None:
        raise _Unfollowable(f"it is a {found} archive")
    else:
        yield None, functools.partial(open, path, "rb")


def _opened(stream: BinaryIO | None) -> BinaryIO:
    if stream is None:
        raise OSError("an archive member cannot be read")
    return stream


def _deepest_line_of(file: BinaryIO, limit: int, budget: _Budget, head: bytes = b"") -> int | str | None:
    """The 1-based line where the nesting first exceeds ``limit``, None if it never does, or why the stream is
    refused (past the file's `_Budget`). ``head``: bytes already read from ``file``."""
    depth, in_string, backslash_run, lines_before = 0, False, 0, 0
    while chunk := head + file.read(CHUNK_BYTES):
        head = b""
        refused = budget.spend(len(chunk))
        if refused is not None:
            return refused
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
