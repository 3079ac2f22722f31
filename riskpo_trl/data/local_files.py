"""Local dataset files read instead of the Hub (offline runs, tests, the bundled examples); a leaf module."""

from __future__ import annotations

import os
from collections.abc import Sequence


def load_local_files(data_files: str | Sequence[str]):
    """Local Parquet (by extension) or JSON/JSONL files as one ``datasets.Dataset``; Parquet keeps features such as
    images."""
    import datasets

    files = check_data_files(data_files)
    builder = "parquet" if str(files[0]).endswith(".parquet") else "json"
    return datasets.load_dataset(builder, data_files=data_files, split="train")


def check_data_files(data_files: str | Sequence[str]) -> list:
    """``data_files`` as a list, after checking that each exists and is not empty (the datasets loader fails on an
    empty file with a bare StopIteration)."""
    files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not files:
        raise ValueError("No dataset files given.")
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Dataset file {path}: no such file.")
        if _is_empty(path):
            raise ValueError(f"Dataset file {path} is empty: it needs at least one example (a JSON line, a JSON "
                             "list, a CSV row or a Parquet file with rows).")
    return files


def _is_empty(path: str | os.PathLike) -> bool:
    """No bytes, or (text formats) only whitespace."""
    if os.path.getsize(path) == 0:
        return True
    if str(path).endswith(".parquet"):
        return False
    with open(path, "rb") as file:
        return not file.read(1 << 16).strip() and os.path.getsize(path) <= 1 << 16
