"""Local dataset files read instead of the Hub (offline runs, tests, the bundled examples); a leaf module."""

from __future__ import annotations

from collections.abc import Sequence


def load_local_files(data_files: str | Sequence[str]):
    """Local Parquet (by extension) or JSON/JSONL files as one ``datasets.Dataset``; Parquet keeps features such as
    images."""
    import datasets

    first_file = data_files if isinstance(data_files, str) else data_files[0]
    builder = "parquet" if str(first_file).endswith(".parquet") else "json"
    return datasets.load_dataset(builder, data_files=data_files, split="train")
