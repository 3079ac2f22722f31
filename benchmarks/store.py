"""Packs: a study's run files folded into one Parquet file, read as if each run were still its own JSON file.

A study caches each run as one JSON file (``<study>/.../runs/<name>.json``). Committed, the runs of a study live in
one pack, ``<study>/runs.parquet``, written by ``python -m benchmarks.store pack <study folder>``. Like git's packs,
a pack and loose files work together: :func:`benchmarks._common.read_json`, ``json_exists`` and ``json_files`` look
for a loose file first (plain, then gzip'd) and then in the pack, so a run that arrives later as a loose file reads
the same, and a packed run counts as cached.

A pack is lossless: one row per run file, its JSON with each long list of numbers moved into a typed column (ints,
float32 where every value is one, decimals with a few significant digits as integer mantissa and exponent, else
float64). ``pack`` decodes every run again and refuses to write unless the JSON text is identical to the original
(key order, ints against floats, every bit of every float). ``benchmarks/results/README.md`` describes the columns
and how to read a pack without this repository.
"""

from __future__ import annotations

import argparse
import fnmatch
import gzip
import json
import os
from collections.abc import Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

PACK_NAME = "runs.parquet"
FORMAT = 1
# The files a pack folds in (each plain or gzip'd): per-run caches and the starts' evaluations, never a report.
PACKED = ("**/runs/*.json", "**/rl_runs/*.json", "**/start_eval.json")
# Shorter lists stay in the JSON text: a column costs more than it saves.
MIN_COLUMN = 8
# Decimal columns: every value has at most this many significant digits (e.g. probabilities stored rounded).
MAX_DECIMAL_DIGITS = 9
COLUMNS = ("i64", "f32", "f64", "dec")
_POW10 = np.array([float(10**i) for i in range(23)])  # exact: every power up to 1e22 is a double


# ---- encoding one run -------------------------------------------------------------------------------------------


def _decimal(values: list[float]) -> tuple[np.ndarray, np.ndarray] | None:
    """Mantissas and exponents with ``value == mantissa * 10**exponent`` exactly, or None."""
    mantissas, exponents = [], []
    for value in values:
        sign, digits, exponent = Decimal(repr(value)).as_tuple()
        if not isinstance(exponent, int) or len(digits) > MAX_DECIMAL_DIGITS or not -22 <= exponent <= 22:
            return None
        mantissa = int("".join(map(str, digits)))
        mantissas.append(-mantissa if sign else mantissa)
        exponents.append(exponent)
    return np.array(mantissas, dtype=np.int64), np.array(exponents, dtype=np.int8)


def _from_decimal(mantissas: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    mantissas = mantissas.astype(np.float64)
    exponents = exponents.astype(np.int64)
    return np.where(
        exponents < 0, mantissas / _POW10[-np.minimum(exponents, 0)], mantissas * _POW10[np.maximum(exponents, 0)]
    )


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(a.view(np.int64) == b.view(np.int64)))


def _column(values: list, columns: dict[str, list]) -> dict[str, int] | None:
    """Move ``values`` into a typed column when all are ints or all floats; the marker that replaces them."""
    if len(values) < MIN_COLUMN:
        return None
    if all(type(v) is int for v in values):
        if not all(-(2**63) <= v < 2**63 for v in values):
            return None
        kind, data = "i64", np.array(values, dtype=np.int64)
    elif all(type(v) is float for v in values):
        exact = np.array(values, dtype=np.float64)
        as_f32 = exact.astype(np.float32)
        if _same_bits(as_f32.astype(np.float64), exact):
            kind, data = "f32", as_f32
        else:
            decimal = _decimal(values) if np.all(np.isfinite(exact)) else None
            if decimal is not None and _same_bits(_from_decimal(*decimal), exact):
                kind, data = "dec", decimal
            else:
                kind, data = "f64", exact
    else:
        return None
    columns[kind].append(data)
    return {f"${kind}": len(columns[kind]) - 1}


def _encode(node: Any, columns: dict[str, list]) -> Any:
    if isinstance(node, dict):
        bad = [k for k in node if k.startswith("$")]
        if bad:
            raise ValueError(f"cannot pack a key starting with '$' ({bad[0]!r}): the pack reserves them")
        return {k: _encode(v, columns) for k, v in node.items()}
    if isinstance(node, list):
        marker = _column(node, columns)
        if marker is not None:
            return marker
        if (
            len(node) >= MIN_COLUMN
            and all(isinstance(v, dict) and v for v in node)
            and len({tuple(v) for v in node}) == 1
        ):
            # A list of records with the same keys (one per batch, one per checkpoint): stored column by column.
            return {"$rows": {k: _encode([v[k] for v in node], columns) for k in node[0]}}
        return [_encode(v, columns) for v in node]
    return node


def encode_run(run: Any) -> dict[str, Any]:
    """One pack row: ``json`` (the run's text with markers) and the typed columns its markers index."""
    columns: dict[str, list] = {kind: [] for kind in COLUMNS}
    text = json.dumps(_encode(run, columns), separators=(",", ":"))
    row: dict[str, Any] = {"json": text}
    for kind in ("i64", "f32", "f64"):
        row[kind] = [a.tolist() for a in columns[kind]]
    row["dec_mantissa"] = [m.tolist() for m, _ in columns["dec"]]
    row["dec_exponent"] = [e.tolist() for _, e in columns["dec"]]
    return row


# ---- decoding one run -------------------------------------------------------------------------------------------


def _decode(node: Any, row: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if len(node) == 1:
            ((key, value),) = node.items()
            if key in ("$i64", "$f64"):
                return list(row[key[1:]][value])
            if key == "$f32":  # a float32 is exactly a double; as_py gives that double
                return list(row["f32"][value])
            if key == "$dec":
                mantissas = np.array(row["dec_mantissa"][value], dtype=np.int64)
                exponents = np.array(row["dec_exponent"][value], dtype=np.int8)
                return _from_decimal(mantissas, exponents).tolist()
            if key == "$rows":
                fields = {k: _decode(v, row) for k, v in value.items()}
                length = len(next(iter(fields.values())))
                return [{k: column[i] for k, column in fields.items()} for i in range(length)]
        return {k: _decode(v, row) for k, v in node.items()}
    if isinstance(node, list):
        return [_decode(v, row) for v in node]
    return node


def decode_run(row: dict[str, Any]) -> Any:
    """The run a pack row holds, equal to the JSON file it was packed from."""
    return _decode(json.loads(row["json"]), row)


# ---- a pack on disk ---------------------------------------------------------------------------------------------


class Pack:
    """The runs of one pack file, by path relative to the pack's folder (``low/runs/grpo-lr1e-05-seed0.json``)."""

    def __init__(self, path: Path):
        import pyarrow.parquet as pq

        self.path = Path(path)
        self.table = pq.read_table(self.path)
        meta = json.loads(self.table.schema.metadata[b"riskpo_pack"])
        if meta["format"] != FORMAT:
            raise ValueError(f"{self.path} is pack format {meta['format']}; this code reads format {FORMAT}")
        self.dropped: list[str] = meta.get("dropped", [])
        self.index = {name: i for i, name in enumerate(self.table.column("path").to_pylist())}

    def __contains__(self, name: str) -> bool:
        return name in self.index

    def names(self) -> list[str]:
        return sorted(self.index)

    def read(self, name: str) -> Any:
        i = self.index[name]
        row = {c: self.table.column(c)[i].as_py() for c in self.table.column_names}
        return decode_run(row)


_OPEN: dict[Path, tuple[tuple[int, int], Pack]] = {}


def open_pack(path: Path) -> Pack:
    """The pack at ``path``, read once and kept while the file is unchanged."""
    path = Path(path)
    stat = path.stat()
    key = (stat.st_mtime_ns, stat.st_size)
    cached = _OPEN.get(path)
    if cached is None or cached[0] != key:
        cached = (key, Pack(path))
        _OPEN[path] = cached
    return cached[1]


def _packs_above(path: Path) -> Iterator[tuple[Pack, str]]:
    """Each pack in a folder above ``path`` (nearest first) with ``path``'s name relative to that folder."""
    path = Path(os.path.abspath(path))
    for folder in path.parents:
        candidate = folder / PACK_NAME
        if candidate.is_file():
            yield open_pack(candidate), path.relative_to(folder).as_posix()


def find_packed(path: Path) -> tuple[Pack, str] | None:
    """The pack holding the JSON file ``path`` (its plain name) and the name it has there, or None."""
    for pack, name in _packs_above(path):
        if name in pack:
            return pack, name
    return None


def packed_files(directory: Path, pattern: str) -> set[str]:
    """The names of the packed files directly in ``directory`` that match ``pattern``."""
    names: set[str] = set()
    for pack, prefix in _packs_above(Path(directory) / "_"):
        folder = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        for name in pack.names():
            rest = name[len(folder) :]
            if name.startswith(folder) and "/" not in rest and fnmatch.fnmatch(rest, pattern):
                names.add(rest)
    return names


# ---- folding loose files into a pack ----------------------------------------------------------------------------


def _drop(run: Any, dotted: str) -> None:
    """Remove the field ``dotted`` where present: ``curves.entropy``; ``[]`` steps into each item of a list; a step
    may be a pattern (``tracked.[].val.*digit.pass@*``)."""
    head, _, rest = dotted.partition(".")
    if head == "[]":
        for item in run if isinstance(run, list) else []:
            if rest:
                _drop(item, rest)
        return
    if not isinstance(run, dict):
        return
    for key in [k for k in run if fnmatch.fnmatchcase(k, head)]:
        if rest:
            _drop(run[key], rest)
        else:
            del run[key]


def _loose_files(folder: Path) -> dict[str, Path]:
    """Loose run files under ``folder`` by plain name relative to it (a plain file wins over its ``.gz``)."""
    found: dict[str, Path] = {}
    for pattern in PACKED:
        for path in sorted(folder.glob(pattern + ".gz")):
            found[path.relative_to(folder).as_posix().removesuffix(".gz")] = path
        for path in sorted(folder.glob(pattern)):
            found[path.relative_to(folder).as_posix()] = path
    return found


def _read_loose(path: Path) -> Any:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def write_pack(folder: Path, runs: dict[str, Any], dropped: Sequence[str] = ()) -> Path:
    """Write ``runs`` (name relative to ``folder`` -> run) as ``folder/runs.parquet``, after checking that every
    run decodes to the same JSON text; returns the pack's path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = sorted(runs)
    rows = [encode_run(runs[name]) for name in names]
    for name, row in zip(names, rows):
        if json.dumps(decode_run(row)) != json.dumps(runs[name]):
            raise AssertionError(f"{name}: the packed form does not decode to the same JSON; nothing was written")
    schema = pa.schema(
        [
            ("path", pa.string()),
            ("json", pa.string()),
            ("i64", pa.list_(pa.list_(pa.int64()))),
            ("f32", pa.list_(pa.list_(pa.float32()))),
            ("f64", pa.list_(pa.list_(pa.float64()))),
            ("dec_mantissa", pa.list_(pa.list_(pa.int64()))),
            ("dec_exponent", pa.list_(pa.list_(pa.int8()))),
        ],
        metadata={"riskpo_pack": json.dumps({"format": FORMAT, "dropped": list(dropped)})},
    )
    table = pa.Table.from_pylist([{"path": n, **r} for n, r in zip(names, rows)], schema=schema)
    target = Path(folder) / PACK_NAME
    temporary = target.with_name(PACK_NAME + ".tmp")
    pq.write_table(
        table,
        temporary,
        compression="zstd",
        compression_level=19,
        use_dictionary=["path"],
        # Floats and mantissas compress far better byte plane by byte plane (sign and exponent bytes repeat).
        column_encoding={
            f"{c}.list.element.list.element": "BYTE_STREAM_SPLIT" for c in ("f32", "f64", "dec_mantissa")
        },
        write_statistics=False,
        row_group_size=max(1, len(names)),
    )
    written = Pack(temporary)
    for name in names:
        if json.dumps(written.read(name)) != json.dumps(runs[name]):
            temporary.unlink()
            raise AssertionError(f"{name}: the pack on disk does not read back the same JSON; nothing was written")
    temporary.replace(target)
    return target


def pack(folder: Path, drop: Sequence[str] = ()) -> dict[str, int]:
    """Fold the loose run files under ``folder`` into ``folder/runs.parquet`` (a loose file replaces the packed run
    of its name), then delete them. ``drop`` names fields removed from every run (recorded in the pack)."""
    folder = Path(folder)
    target = folder / PACK_NAME
    runs: dict[str, Any] = {}
    dropped = sorted(set(drop))
    if target.exists():
        existing = Pack(target)
        runs = {name: existing.read(name) for name in existing.names()}
        dropped = sorted(set(existing.dropped) | set(drop))
    loose = _loose_files(folder)
    before = sum(p.stat().st_size for p in loose.values()) + (target.stat().st_size if target.exists() else 0)
    for name, path in loose.items():
        runs[name] = _read_loose(path)
    for run in runs.values():
        for field in dropped:
            _drop(run, field)
    if not runs:
        return {"runs": 0, "loose": 0, "bytes_before": 0, "bytes_after": 0}
    write_pack(folder, runs, dropped)
    for path in loose.values():
        path.unlink()
    return {"runs": len(runs), "loose": len(loose), "bytes_before": before, "bytes_after": target.stat().st_size}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.store",
        description="Fold a study's loose run files (runs/*.json, rl_runs/*.json, start_eval.json; plain or gzip'd) "
        "into its pack, <folder>/runs.parquet.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fold = sub.add_parser("pack", help="fold the loose run files under each FOLDER into FOLDER/runs.parquet")
    fold.add_argument("folders", nargs="+", type=Path, metavar="FOLDER")
    fold.add_argument(
        "--drop",
        nargs="+",
        default=[],
        metavar="FIELD",
        help="fields no report reads, removed from every run (dotted; [] for each item: tracked.[].val)",
    )
    args = parser.parse_args(argv)
    for folder in args.folders:
        if not folder.is_dir():
            parser.error(f"{folder} is not a folder: give a study's results folder, e.g. benchmarks/results/lm_exact")
        done = pack(folder, args.drop)
        print(
            f"{folder}: {done['runs']} runs ({done['loose']} loose folded in), "
            f"{done['bytes_before'] / 1e6:.2f} MB -> {done['bytes_after'] / 1e6:.2f} MB"
        )


if __name__ == "__main__":
    main()
