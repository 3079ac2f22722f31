"""Datasets loaded by id (a Hub id, a registered dataset's Hub files) have their cache built in a child process
first, so that a crash while `datasets` builds it cannot take the caller down.

Local data files are scanned before `datasets` reads them (:mod:`riskpo_trl.data.local_files`), but the files a
dataset id fetches are not on disk until `datasets` has fetched them, and a JSON row nested deeper than Arrow holds
crashes pyarrow's reader (SIGSEGV) while the cache is built. :func:`load_dataset_isolated` runs the same
``datasets.load_dataset`` call in a fresh interpreter (same arguments, same environment, so the same cache): if that
child dies by a signal, the caller gets a one-line :class:`DatasetBuildCrashedError` naming the dataset, the signal
and the fix instead of dying; if it succeeds, the caller's own call finds the built cache and only opens it. A child
that fails with an ordinary error hands over to the caller's own call, which raises that error as it always did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

# The child's exit code when `load_dataset` raised: the caller repeats the call, which raises the error itself.
RAISED_EXIT_CODE = 3

CHILD_PROGRAM = f"""
import json, sys
call = json.loads(sys.stdin.read())
try:
    import datasets
    datasets.load_dataset(*call["args"], **call["kwargs"])
except Exception:
    sys.exit({RAISED_EXIT_CODE})
"""


# Signals a process gets from its own fault (a crash in pyarrow's C++), as opposed to one sent from outside.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL})


class DatasetBuildCrashedError(ValueError):
    """Building a dataset's cache killed the process that built it; a ValueError, which the console scripts report
    as one line."""


def load_dataset_isolated(*args: Any, **kwargs: Any):
    """``datasets.load_dataset(*args, **kwargs)``, after building its cache in a child process (see the module's
    docstring). Arguments that do not travel as JSON, or a ``datasets.load_dataset`` replaced in this process (a
    test's stand-in, which a child would not see), make it an in-process call."""
    import datasets
    import datasets.load

    if datasets.load_dataset is datasets.load.load_dataset and _travels(args, kwargs):
        _build_in_child(args, kwargs)
    return datasets.load_dataset(*args, **kwargs)


def _travels(args: tuple, kwargs: dict) -> bool:
    try:
        return json.loads(json.dumps({"args": args, "kwargs": kwargs})) == {"args": list(args), "kwargs": kwargs}
    except (TypeError, ValueError):
        return False


def _build_in_child(args: tuple, kwargs: dict) -> None:
    call = json.dumps({"args": args, "kwargs": kwargs})
    # The child's output (download progress, `datasets`' warnings) goes where the caller's goes.
    child = subprocess.run(
        [sys.executable, "-c", CHILD_PROGRAM], input=call, text=True, env=_same_caches(), check=False
    )
    if child.returncode >= 0:
        return  # built, or an ordinary error the caller's own call raises
    number = -child.returncode
    if number == signal.SIGINT:
        raise KeyboardInterrupt  # Ctrl-C reached the child too: the user stopped the load
    raise DatasetBuildCrashedError(
        f"dataset {_described(args, kwargs)}: the process building its cache was killed by {_signal_name(number)}, "
        f"so it was not loaded. {_cause_and_fix(number)}"
    )


def _cause_and_fix(number: int) -> str:
    if number in CRASH_SIGNALS:
        return (
            "A crash while `datasets` reads its files (a JSON row nested deeper than Arrow holds does this): download "
            "the dataset's data files and give them as local files (--dataset_name json --dataset_files FILES), "
            "whose scan names the file and line at fault."
        )
    if number == signal.SIGKILL:
        return (
            "Out of memory (the kernel's OOM killer), or killed from outside: check `dmesg` or the container's memory "
            "limit, and load it where more memory is free."
        )
    return "It was stopped from outside while it built; nothing points at the dataset: run again."


def _same_caches() -> dict[str, str]:
    """The environment, with the caches and offline mode this process uses, though set after its start (as
    :mod:`riskpo_trl.hub_access` sets offline mode): the child builds the cache the caller then opens."""
    import datasets.config
    from huggingface_hub import constants

    env = dict(
        os.environ, HF_DATASETS_CACHE=str(datasets.config.HF_DATASETS_CACHE), HF_HUB_CACHE=constants.HF_HUB_CACHE
    )
    if constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _described(args: tuple, kwargs: dict) -> str:
    """The call as the user would recognise it: the dataset, then what was set (an unset config is left out)."""
    shown = [repr(arg) for arg in args if arg is not None]
    shown += [f"{key}={value!r}" for key, value in kwargs.items() if value is not None]
    described = ", ".join(shown)
    return described if len(described) <= 200 else described[:197] + "..."


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
