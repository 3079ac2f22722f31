"""Every dependence on TRL's or transformers' private API, and every difference between their supported releases.

The supported range is the tested one. `TESTED` holds its ends and `PINS` the pins pyproject.toml declares, the same
numbers (`tests/test_compat.py` checks that); CI runs the fast suite and the tests that train the tiny model at both
ends (`.ci/compat.sh`). `check_versions` refuses anything else, once, when the trainer is imported.

The private API the package uses is listed in `compat.private_api`. The assumptions about TRL's behaviour that would
otherwise fail silently are checked as the trainer runs, here (`check_gathered_rewards`, `check_buffered_micro_batch`,
`check_logged_advantages`: a `TRLChangedError` naming the installed TRL).

Differences between the supported releases, each handled here or in this package's two other modules:

- TRL < 1.16: with ``use_liger_kernel=True`` the loss is Liger's and `_compute_loss` never runs
  (`liger_skips_compute_loss`), so RiskPOConfig refuses the settings that act through it.
- Generation and multimodal code (`compat.generation`): TRL's `unwrap_model_for_generation` before 1.16, a VLM's image
  token before 1.16, transformers 4.x's CLIP image processor, tools and ``environment_factory``, which TRL refuses
  before transformers 5, and which reward functions TRL 1.13 awaits.
- vLLM server mode on CPU (`compat.serving`): TRL 1.16's client and vLLM's weight-transfer API, checked with TRL 1.16.0
  and vLLM 0.31.0 only.

Not used, as they are missing from some supported releases: `Trainer.end` (transformers >= 5.18; the train script
calls `accelerator.end_training()`, all it does) and `PreTrainedModel.all_tied_weights_keys` (transformers 5;
`job.checkpoint_guards` finds tied weights by tensor identity).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import warnings
from functools import cache
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

# The lowest and the newest tested release of each.
TESTED = {"trl": ("1.13.0", "1.16.0"), "transformers": ("4.56.2", "5.24.0")}
# Releases inside the range that are refused, and why.
EXCLUDED = {
    "trl": {"1.15.0": "it cannot train on CPU ('NoneType' object has no attribute 'apply') and has no patch release"},
    "transformers": {
        "5.1.0": "TRL's deepspeed extra excludes it",
        "5.2.0 to 5.5.3": "they divide the loss by gradient_accumulation_steps twice, so with gradient accumulation "
        "every gradient silently shrinks by that factor (5.5.4 fixed it)",
    },
}
# pyproject.toml's pins: from the lowest tested release to before the minor release after the newest tested one,
# without the excluded releases.
PINS = {
    "trl": ">=1.13.0,<1.17,!=1.15.0",
    "transformers": ">=4.56.2,<5.25,!=5.1.0,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,!=5.5.1,!=5.5.2,!=5.5.3",
}
# GRPOTrainer's loss_type values, the same from TRL 1.13 to 1.16. TRL reads the field only in the loss, so an unknown
# one would fail at the first step; tests/test_compat.py reads them off the installed TRL's source.
TRL_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
# Set to 1 to import the trainer with releases outside the range anyway (a warning instead of the error); CI's check
# of TRL's newest release uses it.
ALLOW_UNTESTED_ENV = "RISKPO_ALLOW_UNTESTED_VERSIONS"


class UnsupportedVersionError(ImportError):
    """TRL or transformers is outside the tested range."""


def installed_version(package: str) -> str | None:
    """The installed release of ``package``, or None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def version_problems() -> list[str]:
    """One line per package outside its pins, naming the installed release and the supported range."""
    problems = []
    for package, pins in PINS.items():
        installed = installed_version(package)
        if installed is not None and Version(installed) in SpecifierSet(pins):
            continue
        lowest, newest = TESTED[package]
        excluded = "; ".join(f"{releases} excluded: {why}" for releases, why in EXCLUDED[package].items())
        found = "not installed" if installed is None else f"{installed} installed"
        problems.append(f"{package} {found}; supported: {package}{pins} (tested {lowest} to {newest}; {excluded})")
    return problems


@cache
def check_versions() -> None:
    """Raise one `UnsupportedVersionError` naming every package outside the supported range and the pip command that
    installs supported releases; with RISKPO_ALLOW_UNTESTED_VERSIONS=1, warn instead."""
    problems = version_problems()
    if not problems:
        return
    install = " ".join(f"'{package}{pins}'" for package, pins in PINS.items())
    message = (
        "riskpo-trl supports the TRL and transformers releases it is tested with, and this environment has others:\n  "
        + "\n  ".join(problems)
        + f"\nInstall supported releases: pip install {install}\nTo run untested releases anyway, set "
        f"{ALLOW_UNTESTED_ENV}=1 (docs/installation.md: Tested versions)."
    )
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        warnings.warn(message, stacklevel=2)
        return
    raise UnsupportedVersionError(message)


def trl_before(release: str) -> bool:
    installed = installed_version("trl")
    return installed is not None and Version(installed) < Version(release)


# --- TRL ------------------------------------------------------------------------------------------------------------


def liger_skips_compute_loss() -> bool:
    """Whether ``use_liger_kernel=True`` makes the loss Liger's, so that `_compute_loss` never runs: TRL 1.13 and
    1.14 (from 1.16 Liger only supplies layer kernels and the loss is `_compute_loss`)."""
    return trl_before("1.16.0")


# --- TRL's behaviour the trainer relies on, checked as it runs -------------------------------------------------------


class TRLChangedError(RuntimeError):
    """The installed TRL no longer behaves as the trainer relies on: a private API it builds on has changed."""


def trl_changed(assumption: str) -> TRLChangedError:
    """The one error of a broken assumption about TRL: what was relied on, what happened, and the installed release."""
    lowest, newest = TESTED["trl"]
    return TRLChangedError(
        f"TRL {installed_version('trl')} does not behave as riskpo-trl relies on: {assumption}. riskpo-trl is "
        f"tested with TRL {lowest} to {newest}; install one of those (pip install 'trl{PINS['trl']}'), or report "
        "this with the TRL release."
    )


def check_gathered_rewards(rows: int, local_completions: int, num_processes: int) -> None:
    """`GRPOTrainer._calculate_rewards` returns the rewards of the whole batch, gathered over all processes (the
    advantage step bundles the whole batch; each process then takes its slice)."""
    if rows != local_completions * num_processes:
        raise trl_changed(
            f"GRPOTrainer._calculate_rewards returns the rewards gathered over all {num_processes} process(es), "
            f"{local_completions * num_processes} rows for {local_completions} completions per process; it returned "
            f"{rows} rows"
        )


def check_buffered_micro_batch(inputs: Any, buffered: Any, index: int) -> None:
    """`GRPOTrainer._prepare_inputs` returns, in training, the micro-batch ``_buffered_inputs[index]`` with ``index =
    _step % steps_per_generation`` (the token mean's factor of that micro-batch is applied to it)."""
    if buffered is None or not 0 <= index < len(buffered) or buffered[index] is not inputs:
        raise trl_changed(
            "GRPOTrainer._prepare_inputs returns the micro-batch _buffered_inputs[_step % steps_per_generation] in "
            f"training (here {index}); it returned another one, so the token mean's factor would belong to another "
            "micro-batch"
        )


def check_logged_advantages(logged: Any, gathered: int, local: list[float], start: int) -> None:
    """The completions table's last ``gathered`` advantages (``logged``, a bounded deque) are this batch's, as TRL
    logged them: GRPO's advantages of the whole batch, of which this process's are ``local``, from ``start`` on."""
    kept = min(gathered, len(logged))
    tail = list(logged)[len(logged) - kept :]
    first = gathered - kept  # the batch position of the first entry kept
    overlap = range(max(start, first), min(start + len(local), gathered))
    if (gathered and not kept) or any(tail[i - first] != local[i - start] for i in overlap):
        raise trl_changed(
            f"GRPOTrainer._generate_and_score_completions logs the {gathered} advantages of the batch it returns as "
            "the completions table's last entries; the table's last entries are not this batch's, so replacing them "
            "with RiskPO's would rewrite other completions' rows"
        )
