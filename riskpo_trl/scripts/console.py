"""A readable console for training runs: each logging step prints one compact line with the metrics instead of the
full metrics dict, and the console scripts report a user's mistake as one ``error:`` line (this module stays light,
for entry points to call before their heavy imports)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

# What a console script reports as a user's mistake (one line, exit code 2) while it sets a run up: bad options, files
# or values. Anything else, and anything raised once training runs, is a crash and keeps its traceback.
USAGE_ERRORS = (ValueError, TypeError, OSError)
USAGE_ERROR_EXIT_CODE = 2  # argparse's code for a usage error
DEBUG_FLAG = "--debug"

# Where the risk profile's objective goes in the line: the run's profile names it (its registry entry's ``metric``,
# ``risk/<profile>``), so a new profile shows without a line here.
PROFILE_OBJECTIVE = ("", "")

# Groups of (label in the line, logged metric); missing or empty metrics are skipped.
COMPACT_METRICS = (
    ("", (("loss", "loss"), ("reward", "reward"), ("len", "completions/mean_length"))),
    (
        "risk: ",
        (
            ("q_alpha", "risk/q_alpha"),
            ("q_beta", "risk/q_beta"),
            ("bundle_score", "risk/bundle_score_mean"),
            PROFILE_OBJECTIVE,
            ("lower_rvar", "risk/lower_rvar"),
            ("upper_rvar", "risk/upper_rvar"),
            ("zero_adv", "risk/frac_zero_advantage"),
            ("unscorable", "risk/frac_unscorable"),
        ),
    ),
    ("", (("lr", "learning_rate"),)),
)


def pop_debug_flag(argv: Sequence[str]) -> tuple[list[str], bool]:
    """``argv`` without a bare ``--debug`` (one not followed by a value: ``--debug underflow_overflow`` is
    TrainingArguments' own option), and whether it was there."""
    argv = list(argv)
    for i, token in enumerate(argv):
        if token == DEBUG_FLAG and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            return argv[:i] + argv[i + 1 :], True
    return argv, False


@contextlib.contextmanager
def usage_errors(prog: str, debug: bool = False, errors: tuple[type[BaseException], ...] = USAGE_ERRORS) -> Iterator:
    """Within the block, ``errors`` print as ``prog: error: message`` on stderr and exit with code 2 (argparse's
    convention), unless ``debug``: then they raise with their traceback."""
    try:
        yield
    except errors as error:
        if debug:
            raise
        print(f"{prog}: error: {error}", file=sys.stderr)
        raise SystemExit(USAGE_ERROR_EXIT_CODE) from None


def compact_log_line(
    logs: dict[str, Any], step: int, max_steps: int, objective_metric: str | None = None
) -> str | None:
    """``[step 3/6] loss 0.09, reward 0.5, len 15 | risk: q_alpha 0.02, ... | lr 5e-05`` for a training or evaluation
    log of a GRPO-family trainer, else None (the run summary). A training step that reuses a generation batch logs no
    reward, so its line has the loss and the learning rate only. Evaluation logs (``eval_`` prefix) get an ``eval``
    line; a baseline's line has no risk part. ``objective_metric``: the run's risk profile's (``risk/mvar``)."""
    prefix = "eval_" if "eval_reward" in logs or "eval_loss" in logs else ""
    if not prefix and "reward" not in logs and "loss" not in logs:
        return None
    groups = []
    objective = (objective_metric.removeprefix("risk/"), objective_metric) if objective_metric else None
    for title, metrics in COMPACT_METRICS:
        named = [objective if pair is PROFILE_OBJECTIVE else pair for pair in metrics]
        values = [(label, logs.get(prefix + name)) for label, name in filter(None, named)]
        parts = [f"{label} {format_number(value)}" for label, value in values if value is not None]
        if parts:
            groups.append(title + ", ".join(parts))
    return f"[{'eval ' if prefix else ''}step {step}/{max_steps}] " + " | ".join(groups)


# Below this magnitude a logged float is rounding noise of a quantity that is zero (a loss of 2.776e-17).
FLOAT_NOISE = 1e-12


def format_number(value: Any) -> str:
    """A logged value for the console: numbers to 4 significant digits, with |x| < 1e-12 shown as 0; booleans and
    anything else as they are."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and abs(value) < FLOAT_NOISE:
        return "0"
    return f"{value:.4g}"


def plain_log_line(logs: dict[str, Any]) -> str:
    """``train_runtime 12.3, train_loss 0, epoch 3`` for a log the compact line does not cover (the run summary):
    every value formatted as a number, not TRL's dict of strings. ``total_flos`` is left out, as TRL's printer
    does."""
    return ", ".join(f"{name} {format_number(value)}" for name, value in logs.items() if name != "total_flos")


# --- the compact console line as a callback (transformers is imported on use: this module stays light)


def use_compact_log(trainer) -> None:
    """Swap the trainer's tqdm progress callback for one that prints a step's metrics as one compact line (the full
    set still goes to ``report_to`` and ``trainer_state.json``; other logs, such as the run summary, print as one
    ``name value, ...`` line with the same number format).
    Nothing changes when tqdm is off (``disable_tqdm``: the plain printer keeps printing every metric)."""
    from transformers.trainer_callback import ProgressCallback

    rule = getattr(getattr(trainer, "risk_estimator", None), "rule", None)  # a baseline trainer has none
    objective_metric = rule.profile.metric if rule is not None else None

    class CompactLogCallback(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if self.training_bar is None:
                return super().on_log(args, state, control, logs=logs, **kwargs)
            line = compact_log_line(logs or {}, state.global_step, state.max_steps, objective_metric)
            if line is None:
                line = plain_log_line(logs or {})
            if state.is_world_process_zero:
                self.training_bar.write(line)

    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(CompactLogCallback)
