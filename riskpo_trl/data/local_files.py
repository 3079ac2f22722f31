"""Local dataset files read instead of the Hub (offline runs, tests, the bundled examples), and folders of them.

Every file is checked before `datasets` sees it: it exists, it is not empty, and a file read as JSON does not nest
deeper than Arrow can hold (:mod:`riskpo_trl.data.json_nesting`; a deeper row crashes pyarrow's reader).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

# What a folder of data is read for, by extension, and the `datasets` builder of each.
FOLDER_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def load_local_files(data_files: str | Sequence[str]):
    """Local files, or folders of them, as one ``datasets.Dataset``, read by their extension (:func:`reader_of`: JSON
    lines, JSON, CSV or Parquet, which keeps features such as images)."""
    import datasets

    files = check_data_files(data_files)
    return datasets.load_dataset(reader_of(files[0]), data_files=files, split="train")


def reader_of(path: str | os.PathLike) -> str:
    """The `datasets` builder that reads ``path`` by its extension: JSON unless it ends in ``.csv`` or ``.parquet``
    (a compressed ``rows.jsonl.gz`` is JSON)."""
    return FOLDER_FORMATS.get(_extension(path), "json")


def check_data_files(data_files: str | Sequence[str], reader: str | None = None) -> list[str]:
    """``data_files`` as a list of files, a folder replaced by its data files (:func:`folder_data_files`), after
    checking that each exists, is not empty (the datasets loader fails on an empty file with a bare StopIteration)
    and, if it is read as JSON, is not nested too deeply. ``reader``: the `datasets` builder that reads them
    (``json``, ``csv``, ``parquet``); None: by extension, JSON unless ``.parquet`` or ``.csv``."""
    given = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not given:
        raise ValueError("No dataset files given.")
    files = []
    for path in map(str, given):
        if os.path.isdir(path):
            files += _one_split(path)
        elif not os.path.isfile(path):
            raise FileNotFoundError(f"Dataset file {path}: no such file.")
        else:
            files.append(path)
    for path in files:
        _check_file(path, reader)
    return files


def folder_data_files(directory: str) -> dict[str, list[str]]:
    """The data files in ``directory`` (and its subfolders) by split, as `datasets` splits a folder: by file or
    folder name (``train.jsonl``, ``test/``), else all in ``train``. Raises naming the folder when it holds no data
    files, or files of more than one format (which `datasets` would read only one of)."""
    from datasets.data_files import DataFilesDict, EmptyDatasetError, get_data_patterns

    looked_for = ", ".join(FOLDER_FORMATS)
    try:
        patterns = get_data_patterns(directory)
        found = DataFilesDict.from_patterns(patterns, base_path=directory)
    except (EmptyDatasetError, FileNotFoundError):
        found = {}
    splits = {
        str(split): sorted(f for f in files if _extension(f) in FOLDER_FORMATS) for split, files in found.items()
    }
    splits = {split: files for split, files in splits.items() if files}
    if not splits:
        raise FileNotFoundError(f"no data files in {directory} (looked for {looked_for}).")
    formats = sorted({_extension(f) for files in splits.values() for f in files})
    if len(formats) > 1:
        raise ValueError(
            f"{directory} holds data files of several formats ({', '.join(formats)}); a folder is read "
            "in one format. Keep one, or name the files with dataset_files."
        )
    return splits


def folder_format(splits: dict[str, list[str]]) -> str:
    """The `datasets` builder that reads the files :func:`folder_data_files` found."""
    first = next(iter(splits.values()))[0]
    return FOLDER_FORMATS[_extension(first)]


def _one_split(directory: str) -> list[str]:
    """The data files of a folder given among dataset_files: all of them, if their names do not split them."""
    splits = folder_data_files(directory)
    if len(splits) > 1:
        listed = "; ".join(
            f"{split}: {', '.join(os.path.relpath(f, directory) for f in files)}" for split, files in splits.items()
        )
        raise ValueError(
            f"dataset_files {directory}: its file names split it into {', '.join(splits)} ({listed}), "
            "and dataset_files reads one training set. Name the files, or give the folder as "
            "dataset_name (with dataset_train_split)."
        )
    return next(iter(splits.values()))


def _check_file(path: str, reader: str | None) -> None:
    from .json_nesting import check_json_nesting

    if _is_empty(path):
        raise ValueError(
            f"Dataset file {path} is empty: it needs at least one example (a JSON line, a JSON "
            "list, a CSV row or a Parquet file with rows)."
        )
    by_extension = FOLDER_FORMATS.get(_extension(path))
    if reader is not None and by_extension is not None and by_extension != reader:
        raise ValueError(
            f"Dataset file {path} is {by_extension} by its extension, but dataset_name {reader!r} reads it "
            f"as {reader}. Set dataset_name {by_extension}."
        )
    if (reader or reader_of(path)) == "json":
        check_json_nesting(path)


def _extension(path: str | os.PathLike) -> str:
    return os.path.splitext(str(path))[1].lower()


def _is_empty(path: str | os.PathLike) -> bool:
    """No bytes, or (text formats) only whitespace."""
    if os.path.getsize(path) == 0:
        return True
    if str(path).endswith(".parquet"):
        return False
    with open(path, "rb") as file:
        return not file.read(1 << 16).strip() and os.path.getsize(path) <= 1 << 16


# --- the columns and row count of local files, read without `datasets` (riskpo-train's checks before torch loads)

MAX_PEEKED_BYTES = 64 << 20  # larger text files are left to `datasets`: reading them here would cost seconds


def peek_columns(files: Sequence[str]) -> tuple[list[str], int] | None:
    """``(columns, rows)`` of uncompressed JSON lines, JSON list, CSV or Parquet files (the columns in order of first
    appearance, as `datasets` names them), or None for anything this light reader does not read."""
    columns: dict[str, None] = {}
    rows = 0
    for path in files:
        found = _peek_file(str(path))
        if found is None:
            return None
        columns.update(dict.fromkeys(found[0]))
        rows += found[1]
    return list(columns), rows


def _peek_file(path: str) -> tuple[list[str], int] | None:
    reader = FOLDER_FORMATS.get(_extension(path))
    if reader == "parquet":
        import pyarrow.parquet

        metadata = pyarrow.parquet.read_metadata(path)
        return metadata.schema.to_arrow_schema().names, metadata.num_rows
    if reader is None or os.path.getsize(path) > MAX_PEEKED_BYTES:
        return None
    # Bytes that are not UTF-8 are replaced, as the loader's own readers do: the columns are the same either way.
    with open(path, encoding="utf-8", errors="replace", newline="" if reader == "csv" else None) as file:
        if reader == "csv":
            import csv

            table = list(csv.reader(file))
            return (table[0], len(table) - 1) if table else None
        return _json_columns(file.read())


def _json_columns(text: str) -> tuple[list[str], int] | None:
    import json

    try:
        if text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, RecursionError):
        return None  # `datasets` reports it, with its own message
    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        return None
    if len(rows) == 1 and all(isinstance(value, list) for value in rows[0].values()):
        return None  # one object of columns, or one row of lists: left to `datasets`, which tells them apart
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns), len(rows)
