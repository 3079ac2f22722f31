"""Datasets named the way TRL's scripts name them, used as they are (no adapter): a Hub id, a local dataset directory
(written by ``save_to_disk``, or a folder of data files), or a file format (``json``, ``csv``, ``parquet``) with
``data_files``.

Their rows must already hold what the trainer reads: a ``prompt`` column (a string or a list of chat messages) and
the columns the reward functions read (``solution`` for the math rewards). The trainer's start-up checks name a
missing one. A text prompt is prompted as the registered datasets prompt a problem: a user turn carrying
``prompt_template``'s instruction (:func:`apply_prompt_template`); ``prompt_template: raw`` keeps the text as it is.
Chat messages are used as they are. The registered datasets of :mod:`riskpo_trl.data.datasets` are the other way in: they map a known Hub
schema to those columns.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..registry import closest_name, unimported_hint
from .isolated_build import load_dataset_isolated
from .local_files import check_data_files, folder_data_files, folder_format
from .prompts import DEFAULT_PROMPT_TEMPLATE, RAW_PROMPT_TEMPLATE, prompt_from_text

# Formats read from local files by `datasets`' packaged builders, named as TRL's `--dataset_name json` does.
FILE_FORMATS = ("json", "csv", "parquet")

# What each kind of name is, for messages and the model card.
HUB, DIRECTORY, FILES = "hub", "directory", "files"


def tracks_hint() -> str:
    """Said with an unknown dataset name until :mod:`riskpo_trl.tracks` (which this layer never imports) adds the
    other tracks' datasets."""
    return unimported_hint("riskpo_trl.tracks", "the code and geometry tracks")


def user_dataset_kind(name: str, data_files: str | Sequence[str] | None, registered: Sequence[str]) -> str:
    """``"files"``, ``"directory"`` or ``"hub"`` for a ``name`` that is not one of ``registered``; raise a ValueError
    that says what is wrong with it otherwise (a format without files, a missing directory, a misspelled name).
    Nothing is read or downloaded."""
    if name in FILE_FORMATS:
        if not data_files:
            raise ValueError(
                f"dataset_name={name!r} reads local {name} files: give them with dataset_files (--dataset_files "
                "rows.jsonl, or a list in the recipe)."
            )
        check_data_files(data_files, reader=name)
        return FILES
    if os.path.isdir(name):
        if not _saved_to_disk(name):
            _check_folder(name, data_files)
        return DIRECTORY
    if _reads_as_path(name):
        raise FileNotFoundError(
            f"dataset_name={name!r}: no such directory (a local dataset directory, written by "
            "save_to_disk or holding data files, was meant)."
        )
    choices = sorted([*registered, *FILE_FORMATS])
    if "/" not in name:
        raise ValueError(
            f"dataset_name={name!r} is unknown{closest_name(name, choices)}: give a registered dataset "
            f"({', '.join(registered)}), a Hub id (namespace/name), a local dataset directory, or one of "
            f"{list(FILE_FORMATS)} with dataset_files{tracks_hint()}."
        )
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ValueError(
            f"dataset_name={name!r} is neither a Hub id (namespace/name), a local directory, a "
            f"registered dataset nor one of {list(FILE_FORMATS)}."
        ) from None
    return HUB


def _check_folder(directory: str, data_files: str | Sequence[str] | None) -> None:
    """A folder of data files: it has some, of one format, none nested too deeply; and no dataset_files besides
    (`datasets` would look for them inside the folder)."""
    if data_files:
        given = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        raise ValueError(
            f"dataset_name={directory!r} is a folder, read for the data files in it, and dataset_files "
            f"({', '.join(map(str, given))}) is set too. Give one: the folder alone, or the files with dataset_name "
            "json (csv, parquet)."
        )
    splits = folder_data_files(directory)
    check_data_files([f for files in splits.values() for f in files], reader=folder_format(splits))


def apply_prompt_template(dataset, prompt_template: str, where: str):
    """``dataset`` with a text ``prompt`` column prompted as a registered dataset's problems are (a user turn with
    ``prompt_template``'s instruction; ``raw``: as it is). Chat messages stay as they are, and a template other than
    the default cannot apply to them: that is refused."""
    feature = dataset.features.get("prompt")
    is_text = getattr(feature, "dtype", None) in ("string", "large_string")
    if not is_text:
        if feature is not None and prompt_template != DEFAULT_PROMPT_TEMPLATE:
            raise ValueError(
                f"prompt_template={prompt_template!r} applies to a text prompt column; the 'prompt' column of {where} "
                "holds chat messages, used as they are. Leave prompt_template at its default."
            )
        return dataset
    if prompt_template == RAW_PROMPT_TEMPLATE:
        return dataset
    return dataset.map(
        lambda row: {"prompt": prompt_from_text(row["prompt"], prompt_template)},
        desc=f"Prompting with {prompt_template}",
    )


def _reads_as_path(name: str) -> bool:
    """A name only a local path has: absolute, ``./``, ``../``, ``~``, a Windows separator, or under a local
    directory (``data/my_set`` next to ``data/``)."""
    if os.path.isabs(name) or name.startswith((".", "~")) or (os.sep != "/" and os.sep in name):
        return True
    head, slash, _ = name.partition("/")
    return bool(slash) and os.path.isdir(head)


def load_user_dataset(
    name: str,
    kind: str,
    config: str | None = None,
    split: str = "train",
    data_files: str | Sequence[str] | None = None,
):
    """The ``split`` of the dataset ``name`` (of ``kind``, see :func:`user_dataset_kind`), as it is."""
    import datasets

    if kind == FILES:
        return datasets.load_dataset(name, data_files=check_data_files(data_files, reader=name), split=split)
    if kind == DIRECTORY and not _saved_to_disk(name):
        return _load_folder(name, config, split)
    if kind == DIRECTORY:
        saved = datasets.load_from_disk(name)
        if not isinstance(saved, datasets.DatasetDict):
            return saved
        if split not in saved:
            raise ValueError(
                f"The dataset saved in {name} has no split {split!r}; its splits: {list(saved)}. Set "
                "dataset_train_split."
            )
        return saved[split]
    return load_dataset_isolated(name, config, split=split, data_files=data_files)


def _load_folder(directory: str, config: str | None, split: str):
    """The ``split`` of a folder of data files, split by file name as `datasets` does."""
    import datasets

    if config is not None:
        raise ValueError(
            f"dataset_config={config!r} names a configuration of a Hub dataset; the folder {directory} "
            "has none. Remove dataset_config."
        )
    splits = folder_data_files(directory)
    if split not in splits:
        raise ValueError(
            f"{directory} has no data files of split {split!r}: by their names its files are split into "
            f"{', '.join(splits)}. Set dataset_train_split to one of them, or rename the files."
        )
    builder = folder_format(splits)
    files = check_data_files(splits[split], reader=builder)
    return datasets.load_dataset(builder, data_files={split: files}, split=split)


def _saved_to_disk(directory: str) -> bool:
    import datasets

    return any(
        os.path.isfile(os.path.join(directory, file))
        for file in (datasets.config.DATASET_STATE_JSON_FILENAME, datasets.config.DATASETDICT_JSON_FILENAME)
    )
