"""Train a model with RiskPO (or a GRPO-family baseline on identical settings) on math, code or Geometry3K.

Every option comes from a YAML recipe and/or the command line (command line wins), through TRL's parser:

    riskpo-train --config recipes/tiny/riskpo/config_tiny_arithmetic.yaml      # CPU smoke run, tiny random model

    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml -m riskpo_trl.scripts.train \
        --config recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_dapo_math.yaml

``trainer:`` (recipe or ``--trainer``) is read first and picks the config class the rest is parsed into
(:data:`riskpo_trl.trainer.registry.TRAINERS`): a GRPO baseline gets ``GRPOConfig``'s own defaults, RiskPO gets
``RiskPOConfig``'s. A field the chosen config does not have is reported by name before anything else is checked.

``dataset_name`` is a registered dataset (mapped to the trainer's columns) or, used as it is, a Hub id, a local dataset
directory, or ``json``/``csv``/``parquet`` with ``dataset_files`` (riskpo_trl.data.user_datasets). Data named on the
command line replaces the recipe's data settings, and each checkpoint records the data it was trained on: a run in
``output_dir`` on other data is refused in one line (riskpo_trl.scripts.run_data).

One run at a time per ``output_dir``: a second is refused while the first holds its lock (riskpo_trl.job.run_lock).
A run restarts from the last checkpoint in ``output_dir`` by itself, with the same risk settings (a change is refused
at start-up), and a run whose last checkpoint already reached
its end (``max_steps``, or the epochs) says so and exits without training; at the end the model, the tokenizer and the
model card are saved there, and pushed to the Hub when ``push_to_hub`` is set. A mistake in the options, the recipe or
the data is one ``error:`` line and exit code 2 (``--debug`` shows its traceback); field names and values are checked
before torch, transformers and TRL load (riskpo_trl.scripts.known_options).

SIGINT (Ctrl-C), SIGTERM or SIGUSR1 during training stops the run at the end of the current generation batch, saves a
checkpoint there, prints one line (the step, the checkpoint, "Run the same command to resume") and exits with code 75
(``riskpo_trl.job.preemption.STOPPED_EXIT_CODE``), writing no model card; the same command resumes it exactly. A
second Ctrl-C more than a second later aborts at once without saving (exit status 130); once the checkpoint is
saved, further signals are ignored and the exit code stays 75. See
``riskpo_trl.job.preemption``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..data.prompts import DEFAULT_PROMPT_TEMPLATE, PROMPT_BUILDERS
from ..registry import closest_name
from ..risk.defaults import DEFAULT_ADVANTAGE_BASELINE, resolve_advantage_baseline
from ..trainer.registry import TRAINERS, check_trainer_name, get_trainer_classes
from ..weight_sync.bounded import DEFAULT_CHECK_EVERY, DEFAULT_SYNC_TIMEOUT_S
from .console import USAGE_ERRORS, pop_debug_flag, usage_errors
from .recipe_values import check_recipe_values, error_source

logger = logging.getLogger(__name__)

DEFAULT_TRAINER = "riskpo"


@dataclass
class RiskPOScriptArguments:
    """What to train on and with which trainer; the optimisation itself is configured by the trainer's config."""

    trainer: str = field(
        default=DEFAULT_TRAINER,
        metadata={
            "help": "%(choices)s. Picks the config class the recipe is parsed into, so a baseline gets its own "
            "config's defaults.",
            "choices": TRAINERS,
        },
    )
    dataset_name: str = field(
        default="dapo_math",
        metadata={
            "help": "Training set: a registered one, mapped to the trainer's columns (riskpo_trl.data."
            "TRAIN_DATASETS or TRAIN_MIXTURES); or, used as it is, a Hub id, a local dataset directory "
            "(save_to_disk, or a folder of data files) or json/csv/parquet with dataset_files. Rows used as "
            "they are need a 'prompt' column and the columns the rewards read (docs/training.md)."
        },
    )
    dataset_config: str | None = field(
        default=None, metadata={"help": "Configuration of a Hub or local dataset (load_dataset's name)."}
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Split of the training set."})
    dataset_files: list[str] | None = field(
        default=None,
        metadata={
            "help": "Local data files: with a registered dataset_name, in its Hub schema, read instead of the "
            "Hub; with dataset_name json, csv or parquet, rows used as they are."
        },
    )
    prompt_column: str | None = field(
        default=None,
        metadata={"help": "Column of a dataset used as it is that holds the prompt, read as 'prompt'."},
    )
    answer_column: str | None = field(
        default=None,
        metadata={
            "help": "Column of a dataset used as it is that holds the gold answer, read as 'solution' (GSM8K's "
            "'... #### 42' gives 42)."
        },
    )
    prompt_template: str = field(
        default=DEFAULT_PROMPT_TEMPLATE,
        metadata={
            "help": "Prompt of the math datasets: 'qwen_boxed' (problem + 'Please reason step by step, and put "
            "your final answer within \\boxed{}.') or 'authors' (the RiskPO authors' scripts: DAPO-Math-17k's "
            "own prompt kept as it is; MATH and GSM8K: problem + \" Let's think step by step and output the "
            'final answer within \\boxed{}."). A text prompt column of a dataset used as it is gets the same '
            "user turn and instruction; 'raw' keeps it as text (a model without a chat template). Also used for "
            "eval_benchmark.",
            "choices": PROMPT_BUILDERS,
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training rows (of a mixture: after a seeded shuffle)."}
    )
    eval_benchmark: str | None = field(
        default=None,
        metadata={
            "help": "Benchmark evaluated during training when eval_strategy is not 'no' (riskpo_trl.data.BENCHMARKS)."
        },
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N benchmark rows."})
    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_verify"],
        metadata={
            "help": "Reward functions by name, summed with reward_weights (riskpo_trl.rewards.REWARD_FUNCS "
            "and REWARD_BUILDERS)."
        },
    )
    code_sandbox: dict | str | None = field(
        default=None,
        metadata={
            "help": "Settings of the 'code' reward: executor ('bwrap', the default; 'none' only for trusted "
            "test code; riskpo_trl.code.EXECUTORS), max_workers and riskpo_trl.code.SandboxLimits fields (timeouts, memory_mb, disk_mb, "
            "max_files, max_processes, ...), as a YAML mapping in a recipe or a JSON object on the command "
            "line."
        },
    )
    pass_at_k: dict | str | None = field(
        default=None,
        metadata={
            "help": "Held-out Pass@k during training: benchmarks (math ones of riskpo_trl.data.BENCHMARKS, or "
            "NAME=FILE), ks, num_samples, eval_steps, max_problems, max_new_tokens, temperature, top_p, "
            "batch_size, eval_on_start, as a YAML mapping in a recipe or a JSON object on the command line; "
            "logs eval/pass@k (docs/evaluation.md)."
        },
    )
    build_tiny_model: bool = field(
        default=False,
        metadata={
            "help": "If model_name_or_path does not exist, build a tiny random Qwen2 model there first "
            "(CPU smoke runs and tests; nothing is downloaded). A warning says when it does, and whenever a "
            "model built so is loaded. A path that could be a Hub id (such as Qwen/Qwen2.5-0.5B-Instruct) is "
            "refused: give one that can only be local, such as ./outputs/tiny-qwen2."
        },
    )
    build_tiny_vlm: bool = field(
        default=False,
        metadata={
            "help": "Like build_tiny_model, with a tiny random LLaVA vision-language model and its processor "
            "(CPU smoke runs of the Geometry3K track)."
        },
    )

    vllm_generation_timeout: float | None = field(
        default=None,
        metadata={
            "help": "vLLM generation timeout (server mode, any trainer): seconds one generation request may wait "
            "for the server's answer before the run stops at a checkpoint with exit code 75. None: 300 s plus 1 ms "
            "per token the batch may generate (prompts x num_generations x max_completion_length)."
        },
    )
    vllm_sync_timeout: float = field(
        default=DEFAULT_SYNC_TIMEOUT_S,
        metadata={
            "help": "vLLM sync timeout (server mode, any trainer): seconds each request of a weight sync, and each "
            "tensor's transfer to a CPU server, may take before the run stops at a checkpoint with exit code 75."
        },
    )
    vllm_check_every: int = field(
        default=DEFAULT_CHECK_EVERY,
        metadata={
            "help": "vLLM sync check period (server mode, any trainer, a server with this package's worker "
            "extension): verify the server's weights and the log-prob probe after every this many syncs, the first "
            "included. The server's identity is checked on every request whatever this is."
        },
    )

    def __post_init__(self):
        from ..tracks import BENCHMARKS

        # Fail at start-up, before any model or dataset is loaded, on names that do not exist.
        check_trainer_name(self.trainer)
        if self.dataset_files:
            from ..data.local_files import check_data_files
            from ..data.user_datasets import FILE_FORMATS

            # Before a model is built or loaded; read by the format dataset_name names, if it names one.
            check_data_files(
                self.dataset_files, reader=self.dataset_name if self.dataset_name in FILE_FORMATS else None
            )
        if self.dataset_kind == "registered":
            from ..data.prompts import check_not_raw

            check_not_raw(self.prompt_template, self.dataset_name)
        if self.dataset_kind == "registered" and (self.prompt_column is not None or self.answer_column is not None):
            raise ValueError(
                f"prompt_column and answer_column name the columns of a dataset used as it is; "
                f"{self.dataset_name!r} is registered and its adapter maps its columns. Remove them."
            )
        if self.eval_benchmark is not None:
            BENCHMARKS.check(self.eval_benchmark, where="eval_benchmark: ")
        if isinstance(self.code_sandbox, str):  # from the command line
            self.code_sandbox = json.loads(self.code_sandbox)
        if self.pass_at_k is not None:
            from ..evaluation.config import TrainingPassAtK

            self.pass_at_k = TrainingPassAtK.from_block(self.pass_at_k)
        if self.build_tiny_model and self.build_tiny_vlm:
            raise ValueError("Set at most one of build_tiny_model and build_tiny_vlm.")
        self.weight_sync  # noqa: B018 - built here, once: raises naming an out-of-range vllm_* setting
        self.reward_functions  # noqa: B018 - built here, once: raises naming an unknown reward or setting

    @functools.cached_property
    def weight_sync(self):
        """The vLLM server's settings of this job (`riskpo_trl.weight_sync.bounded.SyncSettings`)."""
        from ..weight_sync.bounded import SyncSettings

        return SyncSettings(self.vllm_generation_timeout, self.vllm_sync_timeout, self.vllm_check_every)

    @functools.cached_property
    def dataset_kind(self) -> str:
        """``"registered"`` for an adapted dataset, else how the dataset is read as it is (``"hub"``, ``"directory"``,
        ``"files"``; riskpo_trl.data.user_datasets). Raises on a name that fits none."""
        from ..tracks import TRAIN_DATASETS, TRAIN_MIXTURES

        if self.dataset_name in TRAIN_DATASETS or self.dataset_name in TRAIN_MIXTURES:
            if self.dataset_config is not None:
                raise ValueError(
                    f"dataset_config applies to a Hub id or a local dataset; {self.dataset_name!r} is "
                    "registered with its own. Remove dataset_config."
                )
            return "registered"
        from ..data.user_datasets import user_dataset_kind

        return user_dataset_kind(self.dataset_name, self.dataset_files, [*TRAIN_DATASETS, *TRAIN_MIXTURES])

    @property
    def reward_settings(self) -> dict[str, dict]:
        """Settings of the rewards built from recipe blocks (riskpo_trl.rewards.REWARD_BUILDERS)."""
        if self.code_sandbox is None:
            return {}
        if "code" not in self.reward_funcs:
            logger.warning("code_sandbox is set but reward_funcs has no 'code' reward; it is ignored.")
            return {}
        return {"code": self.code_sandbox}

    @functools.cached_property
    def reward_functions(self) -> list:
        """The reward functions the trainer gets, built from ``reward_funcs`` and ``reward_settings``."""
        from ..tracks import get_reward_funcs

        return get_reward_funcs(self.reward_funcs, self.reward_settings)


def make_parser(config_class: type | None = None):
    """TRL's parser over the script arguments, ``config_class`` (default: RiskPOConfig) and ``ModelConfig``. A bad
    command-line value raises a ValueError naming the option, instead of argparse's usage dump of every option."""
    from trl import ModelConfig, TrlParser

    if config_class is None:
        config_class, _ = get_trainer_classes(DEFAULT_TRAINER)
    from .arguments import RegistryDefaultsHelpFormatter

    parser = TrlParser((RiskPOScriptArguments, config_class, ModelConfig))
    parser.formatter_class = RegistryDefaultsHelpFormatter  # registry choices listed with their help when shown

    def error(message: str):
        raise ValueError(f"{message} (riskpo-train --help-all lists every option)")

    parser.error = error
    return parser


def _option_value(argv: Sequence[str], name: str) -> str | None:
    """The last value given to ``--name`` on the command line (argparse keeps the last), or None."""
    value = None
    for i, token in enumerate(argv):
        if token == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(f"--{name}="):
            value = token.split("=", 1)[1]
    return value


MAX_RECIPE_BYTES = 4 << 20  # a recipe is a few kilobytes of YAML


def _read_recipe(argv: Sequence[str]) -> dict[str, Any]:
    path = _option_value(argv, "config")
    if path is None:
        return {}
    import yaml

    from ..trainer.state_files import StateFileError, UntrustedFileError, decode_text, read_regular_file
    from .recipe_paths import check_recipe_exists

    check_recipe_exists(path)
    try:  # the path the user gave, resolved; what it names must be a regular file of a recipe's size
        text = decode_text(read_regular_file(os.path.realpath(path), MAX_RECIPE_BYTES), path)
    except (UntrustedFileError, StateFileError) as exc:
        raise ValueError(f"The recipe {exc}") from None
    try:
        recipe = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(f"{path} is not valid YAML: {str(error)[:300]}") from None
    except RecursionError:
        raise ValueError(f"{path} nests YAML too deeply to be a recipe.") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"The recipe {path} must be a YAML mapping of field names to values.")
    return recipe


def _check_field_names(parser, recipe: dict[str, Any], argv: Sequence[str], trainer: str, config_name: str) -> None:
    """Report fields the chosen trainer's parser does not know, by name with the closest valid one, before any
    config's own validation runs (a typo must not surface as a confusing error about another field)."""
    known_fields = {action.dest for action in parser._actions} - {"help"}
    known_options = {option for action in parser._actions for option in action.option_strings} | {"--config"}
    unknown = [(key, key, known_fields) for key in recipe if key != "env" and key not in known_fields]
    unknown += [
        (token.split("=", 1)[0], token.split("=", 1)[0].lstrip("-"), {o.lstrip("-") for o in known_options})
        for token in argv
        if token.startswith("--") and token.split("=", 1)[0] not in known_options
    ]
    if not unknown:
        return
    riskpo_fields = set()
    if trainer != DEFAULT_TRAINER:
        from .known_options import trainer_fields

        riskpo_fields = trainer_fields(DEFAULT_TRAINER)
        if riskpo_fields is None:  # other TRL/transformers versions than the list's
            riskpo_config, _ = get_trainer_classes(DEFAULT_TRAINER)
            riskpo_fields = set(riskpo_config.__dataclass_fields__)
    problems = []
    for shown, name, choices in unknown:
        if name in riskpo_fields:
            problems.append(f"{shown} (a RiskPOConfig field; trainer {trainer!r} does not take it)")
        else:
            problems.append(f"{shown}{closest_name(name, choices)}")
    recipe_path = _option_value(argv, "config")
    source = (
        f"{recipe_path} and the command line"
        if recipe_path and len(unknown) > len([k for k in recipe if k != "env" and k not in known_fields])
        else recipe_path or "the command line"
    )
    raise ValueError(
        f"Unknown field(s) for trainer {trainer!r} ({config_name}, the script arguments and ModelConfig) in "
        f"{source}: {'; '.join(problems)}. Fix or remove them."
    )


def help_epilog() -> str:
    """Where the training options are described, one line per registered trainer, and the options most runs set
    (read when the help is shown)."""
    width = max(len(name) for name in TRAINERS)
    trainers = "\n".join(f"  {name:<{width}}  {TRAINERS.help_of(name)}" for name in TRAINERS)
    return f"""\
Training options: every field of the trainer's config class, given in the recipe or as --name value:
{trainers}
RiskPOConfig = trl.GRPOConfig + risk_alpha, risk_beta, risk_omega, bundle_size, risk_profile, quantile_source, ...
(docs/training.md); and trl.ModelConfig (model_name_or_path, dtype, use_peft, lora_r, load_in_4bit, ...). Most used:
  --model_name_or_path   the model: a Hub id or a local directory (trl.ModelConfig)
  --advantage_baseline   RiskPO's baseline: {DEFAULT_ADVANTAGE_BASELINE} (the default) or none (the paper exactly)
  --output_dir           where checkpoints, the model and its card go; a run there resumes
  --max_steps, --learning_rate, --num_generations, --bundle_size, --risk_alpha, --risk_beta
`riskpo-train --help-all [--trainer NAME]` lists them all with their defaults, at once; with --config, with the
recipe's, after loading transformers and TRL ({HELP_ALL_TIME}).
"""


# benchmarks/cli_startup.py's medians for --help-all --config, with their load (benchmarks/results/cli_startup.md).
HELP_ALL_TIME = "11 s of CPU time, 31 s on 2 shared cores at load 7-11"


def reward_funcs_help() -> str:
    """The reward_funcs option's help with the registered names, from the generated list (the reward registry
    imports TRL; a test keeps the list equal to it)."""
    from .known_options_data import REWARDS

    def names(entries: list[str]) -> str:
        quoted = [repr(name) for name in entries]
        return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]

    return (
        f"Reward functions by name, summed with reward_weights: {names(REWARDS['functions'])}; with settings "
        f"(code_sandbox): {names(REWARDS['builders'])}."
    )


def print_short_help() -> None:
    """The script's own options and where the training options are described, without importing torch or TRL."""
    import argparse

    from .arguments import RegistryRawDescriptionHelpFormatter, add_dataclass_arguments

    parser = argparse.ArgumentParser(
        prog="riskpo-train",
        description=__doc__.split("\n\n")[0],
        epilog=help_epilog(),
        formatter_class=RegistryRawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="YAML recipe (recipes/...); command-line options override its fields.")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="Show the traceback of a start-up error (otherwise one 'error:' line, exit code 2).",
    )
    add_dataclass_arguments(parser, RiskPOScriptArguments)
    [rewards] = [action for action in parser._actions if action.dest == "reward_funcs"]
    rewards.help = reward_funcs_help().replace("%", "%%")
    parser.print_help()


def print_help_all_without_recipe(argv: Sequence[str]) -> None:
    """``--help-all`` without ``--config``: print it from the generated list and exit, before torch and TRL load. With
    a recipe (whose values become the defaults shown), or at other library versions, the full parser prints it."""
    from .known_options import help_all_parser

    if _option_value(argv, "config") is not None:
        return
    if "torch" in sys.modules:  # nothing to save, and this process may have registered choices the list lacks
        return
    trainer = _option_value(argv, "trainer") or DEFAULT_TRAINER
    check_trainer_name(trainer)
    parser = help_all_parser(trainer)
    if parser is not None:
        parser.print_help()
        raise SystemExit(0)


def parse_args(argv: Sequence[str] | None = None):
    """``(script_args, training_args, model_args)`` from ``--config`` and the command line.

    ``trainer`` is read first (the command line wins over the recipe) and the rest is parsed into that trainer's
    config class. Unknown fields are reported before any validation. ``--help`` prints the script's options at once,
    ``--help-all`` every option of the chosen trainer's config.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print_short_help()
        raise SystemExit(0)
    if "--help-all" in argv:
        print_help_all_without_recipe(argv)
        argv = [token if token != "--help-all" else "--help" for token in argv]
    from .run_data import recipe_for_command_line

    full_recipe = _read_recipe(argv)
    trainer = _option_value(argv, "trainer") or full_recipe.get("trainer", DEFAULT_TRAINER)
    check_trainer_name(trainer)
    recipe = recipe_for_command_line(full_recipe, argv)  # data named on the command line replaces the recipe's
    recipe_path = _option_value(argv, "config")
    if "--help" not in argv:
        check_options_before_imports(full_recipe, recipe, argv, trainer)
    config_class, _ = get_trainer_classes(trainer)
    parser = make_parser(config_class)
    _check_field_names(parser, full_recipe, argv, trainer, config_class.__name__)
    check_recipe_values(parser, recipe, recipe_path)
    if "--help" in argv:
        show_resolved_defaults(parser, config_class, recipe)
    resolved = []
    if recipe_path is not None:
        from .recipe_paths import resolved_path_options

        resolved = resolved_path_options(recipe, recipe_path, argv)  # inputs named relative to the recipe's repository
    try:
        return _parse_with_recipe(parser, [*argv, *resolved], recipe)
    except ValueError as error:  # a config's own validation: say which flag or recipe field it came from
        where = error_source(str(error), recipe, argv, recipe_path)
        if where is None:
            raise
        raise ValueError(f"{where}: {error}") from error


# Fields a config resolves from the machine it runs on (an accelerator, the log level): their help says how, and
# --help-all, which may be printed from a list generated elsewhere, shows no value for them.
MACHINE_RESOLVED = ("bf16", "disable_tqdm")


def show_resolved_defaults(parser, config_class: type, recipe: dict[str, Any]) -> None:
    """For ``--help-all``: each option whose default is None and that the config resolves at start-up
    (``advantage_baseline``, ``steps_per_generation``, ``bf16``, ...) shows the value a config built from the recipe
    (or the defaults) gets. Nothing is shown where that config cannot be built here (GRPOConfig's bf16 on a CPU)."""
    import dataclasses

    fields = {field.name for field in dataclasses.fields(config_class) if field.init}
    try:
        config = config_class(**{name: value for name, value in recipe.items() if name in fields})
    except (ValueError, TypeError):
        return
    for action in parser._actions:
        value = getattr(config, action.dest, None) if action.dest in fields else None
        if action.dest == "advantage_baseline":
            value = resolve_advantage_baseline(config.advantage_baseline, config.advantage_scaling)
        if (
            action.default is None
            and isinstance(value, (str, int, float, bool))
            and action.dest not in MACHINE_RESOLVED
        ):
            action.resolved_default = value


def check_options_before_imports(
    full_recipe: dict[str, Any], recipe: dict[str, Any], argv: Sequence[str], trainer: str
):
    """Field names, recipe values and command-line values checked against the generated option list, before torch,
    transformers and TRL load (riskpo_trl.scripts.known_options); skipped with versions the list does not hold.
    Returns the light parser that checked them, or None when skipped."""
    from .known_options import light_parser

    light = light_parser(trainer, RiskPOScriptArguments)
    if light is None:
        return None
    parser, config_name = light
    _check_field_names(parser, full_recipe, argv, trainer, config_name)
    check_recipe_values(parser, recipe, _option_value(argv, "config"))
    parser.parse_known_args(_without_config(argv))  # a bad value raises, naming its option
    return parser


def check_before_imports(argv: Sequence[str]) -> str | None:
    """The start-up checks that need no model, torch or TRL (riskpo_trl.scripts.early_checks), on the values the full
    parser will see; returns the "Nothing to train" line when output_dir's run is already finished. A mistake raises
    with the message, and the flag or recipe field, that the later check would give."""
    from . import early_checks

    argv = list(argv)
    if {"-h", "--help", "--help-all"} & set(argv):
        return None
    from .run_data import recipe_for_command_line

    full_recipe = _read_recipe(argv)
    trainer = _option_value(argv, "trainer") or full_recipe.get("trainer", DEFAULT_TRAINER)
    check_trainer_name(trainer)
    recipe = recipe_for_command_line(full_recipe, argv)
    light = check_options_before_imports(full_recipe, recipe, argv, trainer)
    if light is None:
        return None
    recipe_path = _option_value(argv, "config")
    resolved = []
    if recipe_path is not None:
        from .recipe_paths import resolved_path_options

        resolved = resolved_path_options(recipe, recipe_path, argv)
    light.set_defaults(**{name: value for name, value in recipe.items() if name != "env"})
    parsed, _ = light.parse_known_args(_without_config([*argv, *resolved]))
    values = early_checks.with_layout_defaults(parsed, trainer)
    if values is None:
        return None
    check_tiny_model_path(values, values.model_name_or_path)
    try:
        early_checks.check_bundle_layout(values)
    except ValueError as error:  # said as the config's own validation says it: with its flag or recipe field
        where = error_source(str(error), recipe, argv, recipe_path)
        raise ValueError(f"{where}: {error}" if where else str(error)) from None
    early_checks.check_model_name(values)
    early_checks.check_local_data(values)
    return early_checks.check_output_dir(values)


def _parse_with_recipe(parser, argv: Sequence[str], recipe: dict[str, Any]):
    """What ``TrlParser.parse_args_and_config`` does with ``--config``, on a recipe already read (and possibly
    trimmed): its ``env`` block is exported, its fields become the defaults, the command line wins."""
    recipe = dict(recipe)
    for name, value in (recipe.pop("env", None) or {}).items():
        os.environ[name] = str(value)
    unused = parser.set_defaults_with_config(**recipe)
    if unused:
        raise ValueError(f"Unknown arguments from the recipe: {unused}.")
    return parser.parse_args_into_dataclasses(args=_without_config(argv))


def _without_config(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--config PATH`` or ``--config=PATH``."""
    kept, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token == "--config":
            skip = True
        elif not token.startswith("--config="):
            kept.append(token)
    return kept


def build_trainer(script_args: RiskPOScriptArguments, training_args, model_args):
    """The trainer ``script_args.trainer`` names, on the recipe's model, data and rewards."""
    from accelerate import PartialState
    from trl import get_peft_config, get_quantization_config

    from ..job.checks import check_model_path
    from ..job.guard_rails import build as build_with_guard_rails
    from ..tiny_model import warn_if_tiny_random_model
    from ..tracks import load_benchmark, load_train_dataset
    from .console import use_compact_log

    _, trainer_class = get_trainer_classes(script_args.trainer)

    model_path = model_args.model_name_or_path
    if model_path is None:
        raise ValueError(
            "model_name_or_path is not set: give a Hub id or a local directory, in the recipe or as "
            "--model_name_or_path."
        )
    if script_args.build_tiny_model or script_args.build_tiny_vlm:
        build_tiny(script_args, model_path)
    check_model_path(model_path, "model_name_or_path")
    warn_if_tiny_random_model(model_path, "model_name_or_path")  # once: the trainer's own check stays silent

    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }

    train_dataset = load_train_dataset(
        script_args.dataset_name,
        script_args.dataset_train_split,
        script_args.dataset_files,
        script_args.max_train_samples,
        seed=training_args.seed,  # which rows of a mixture max_train_samples keeps
        prompt_template=script_args.prompt_template,
        config=script_args.dataset_config,
        prompt_column=script_args.prompt_column,
        answer_column=script_args.answer_column,
    )
    from .run_data import data_record, describe, record_training_data

    PartialState().print(f"Training on {describe(data_record(script_args))}: {len(train_dataset)} rows.")
    eval_dataset = None
    if script_args.eval_benchmark is not None and training_args.eval_strategy != "no":
        eval_dataset = load_benchmark(
            script_args.eval_benchmark, limit=script_args.max_eval_samples, prompt_template=script_args.prompt_template
        )

    # Given a model id, the trainer loads its processing class: the tokenizer, or for a vision-language model (the
    # Geometry3K track) its processor, and then takes TRL's VLM path for the `images` column.
    # The trainer places a quantized model itself (device_map=None under distributed training), which is what
    # get_kbit_device_map did in older TRL scripts; trl 1.16 no longer ships that helper.
    # Whichever trainer it is (RiskPO's, or TRL's own baseline), the job layer builds it with its guard rails.
    trainer = build_with_guard_rails(
        trainer_class,
        model=model_args.model_name_or_path,
        reward_funcs=script_args.reward_functions,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        peft_config=get_peft_config(model_args),
        quantization_config=get_quantization_config(model_args),
        weight_sync=script_args.weight_sync,
    )
    check_chat_template(trainer.processing_class, train_dataset)
    leave_out_the_templates_instruction(trainer, model_path)
    use_compact_log(trainer)  # the console: one line per logging step
    record_training_data(trainer, script_args)  # in every trainer_state.json: a later command on other data is told
    if script_args.pass_at_k is not None:
        from ..evaluation.callback import add_pass_at_k_callback

        add_pass_at_k_callback(trainer, script_args.pass_at_k, script_args.prompt_template)
    return trainer


def check_chat_template(processing_class, train_dataset) -> None:
    """Chat prompts need the model's chat template (TRL would fail at the first step without one): refuse them, naming
    the setting that trains on text instead."""
    if getattr(processing_class, "chat_template", None) is not None or not len(train_dataset):
        return
    if isinstance(train_dataset[0].get("prompt"), str):
        return
    raise ValueError(
        "The training prompts are chat messages, and the model's tokenizer has no chat template to render them. "
        "Train a model with one (an instruct model), set the tokenizer's chat_template, or give text prompts with "
        "prompt_template raw (a dataset used as it is, with a text prompt column)."
    )


def leave_out_the_templates_instruction(trainer, model_path: str) -> None:
    """Prompts without their own copy of the instruction when the model's chat template writes it by itself
    (Qwen2.5-Math-Instruct's default system turn): the model sees it once, as it was tuned to."""
    from accelerate import PartialState

    from ..data.prompts import instruction_in_chat_template, without_instruction

    instruction = instruction_in_chat_template(trainer.processing_class)
    if instruction is None:
        return
    for split in ("train_dataset", "eval_dataset"):
        dataset = getattr(trainer, split)
        if dataset is not None and "prompt" in dataset.column_names:
            dropped = dataset.map(lambda row: {"prompt": without_instruction(row["prompt"], instruction)})
            setattr(trainer, split, dropped)
    PartialState().print(
        f"The chat template of {model_path} writes {instruction!r} by itself (a default system turn); the prompts "
        "leave out their own copy, so the model reads it once."
    )


def build_tiny(script_args: RiskPOScriptArguments, model_path: str) -> None:
    """Build the tiny random model (or VLM) at ``model_path`` if it does not exist, refusing a path that could be a
    Hub id: a random model saved under a Hub model's name would later load in its place."""
    from accelerate import PartialState

    from ..tiny_model import warn_if_tiny_random_model

    option = "build_tiny_model" if script_args.build_tiny_model else "build_tiny_vlm"
    if os.path.isdir(model_path):
        return
    check_tiny_model_path(script_args, model_path)
    if script_args.build_tiny_model:
        from ..tiny_model import build_tiny_model as build
    else:
        from ..multimodal.tiny_vlm import build_tiny_vlm as build
    state = PartialState()
    with state.local_main_process_first():
        if not os.path.isdir(model_path):
            build(model_path)
            kind = "Qwen2 model" if script_args.build_tiny_model else "LLaVA vision-language model"
            warn_if_tiny_random_model(
                model_path,
                message=(
                    f"{model_path} did not exist: built a tiny RANDOM {kind} there ({option}: true). It has learned "
                    "nothing, and whatever loads it later says so; for a real model give a Hub id or an existing "
                    "directory and set that option to false."
                ),
            )


def check_tiny_model_path(script_args: RiskPOScriptArguments, model_path: str | None) -> None:
    """Refuse to build a tiny random model at a missing ``model_path`` that could be a Hub id. Checked before the
    run's lock creates ``output_dir``: a new ``outputs/`` would make ``outputs/tiny-qwen2`` read as local."""
    from ..job.checks import reads_as_local_path

    if not (script_args.build_tiny_model or script_args.build_tiny_vlm) or not model_path:
        return
    if os.path.isdir(model_path) or reads_as_local_path(model_path):
        return
    option = "build_tiny_model" if script_args.build_tiny_model else "build_tiny_vlm"
    raise ValueError(
        f"model_name_or_path {model_path!r} could be a Hub id, and {option}: true would build a tiny random model "
        f"under that name here, which later runs would load in place of the Hub's. To train that Hub model, set "
        f"{option}: false (--{option} false); for a tiny random model give a path that can only be local, such "
        "as ./outputs/tiny-qwen2."
    )


def hub_datasets(script_args: RiskPOScriptArguments) -> list[str]:
    """Hub ids of the datasets the run really downloaded: none when it read ``dataset_files`` or a local directory."""
    from ..tracks import TRAIN_DATASETS, TRAIN_MIXTURES

    if script_args.dataset_files or script_args.dataset_kind == "directory":
        return []
    if script_args.dataset_kind == "hub":
        return [script_args.dataset_name]
    name = script_args.dataset_name
    parts = TRAIN_MIXTURES[name] if name in TRAIN_MIXTURES else (name,)
    return [TRAIN_DATASETS[part].hub_id for part in parts if part in TRAIN_DATASETS]


def resume_checkpoint(training_args) -> str | None:
    """``resume_from_checkpoint`` if set, else the last checkpoint in ``output_dir`` (a killed run picks up where it
    stopped), else None."""
    from ..job.last_checkpoint import last_complete_checkpoint

    if training_args.resume_from_checkpoint is not None:
        return training_args.resume_from_checkpoint
    if os.path.isdir(training_args.output_dir):
        return last_complete_checkpoint(training_args.output_dir)
    return None


def prepare(script_args: RiskPOScriptArguments, training_args, model_args):
    """``(trainer, checkpoint to resume from or None)``, or ``(None, checkpoint)`` when that checkpoint already
    finished the run this command asks for: then nothing is built, and a missing final save is restored from it."""
    from accelerate import PartialState

    from ..job.checks import check_run_requirements
    from .early_checks import finished_run, nothing_to_train, restore_final_save

    check_run_requirements(training_args)  # vLLM, report_to, push_to_hub: before the model loads
    checkpoint = resume_checkpoint(training_args)
    if checkpoint is not None:
        from .run_data import check_same_data

        check_same_data(checkpoint, script_args, training_args.output_dir)
    finished = finished_run(checkpoint, training_args)
    if finished is None:
        if checkpoint is not None and script_args.trainer == DEFAULT_TRAINER:
            from ..trainer.checkpoints import check_resume_settings

            check_resume_settings(checkpoint, training_args)
        return build_trainer(script_args, training_args, model_args), checkpoint
    state = PartialState()
    with state.main_process_first():
        restored = state.is_main_process and restore_final_save(checkpoint, training_args.output_dir)
    state.print(nothing_to_train(training_args.output_dir, finished, restored))
    return None, checkpoint


def main(script_args: RiskPOScriptArguments, training_args, model_args):
    """Build the trainer, train (resuming from the last checkpoint in ``output_dir``), save model, state and card.
    Returns the trainer, or None when ``output_dir`` already holds a finished run (nothing is trained). Another run
    in the same ``output_dir`` is refused (riskpo_trl.job.run_lock)."""
    from ..job.run_lock import lock_output_dir

    check_tiny_model_path(script_args, model_args.model_name_or_path)
    with lock_output_dir(training_args.output_dir):
        trainer, checkpoint = prepare(script_args, training_args, model_args)
        return trainer and train_and_save(trainer, script_args, training_args, checkpoint)


def train_and_save(
    trainer, script_args: RiskPOScriptArguments, training_args, checkpoint: str | None, exit_after_stop: bool = False
):
    """Train from ``checkpoint`` (None: from scratch), then save the model, the trainer state and the card; a run
    that took no step raises before anything is saved. ``exit_after_stop``: the process is this script's own, and a
    stopped run ends it within a few seconds of its stop line (job.preemption)."""
    from ..job.guard_rails import train
    from ..job.preemption import stopping_on_signals

    if checkpoint is not None:
        trainer.accelerator.print(f"Resuming from {checkpoint}.")
    with stopping_on_signals(trainer, exit_after_stop) as stop:
        train(trainer, resume_from_checkpoint=checkpoint)
    if stop.stopped_at is not None:
        stop.finish(trainer)  # one line, no card; raises RunStopped: exit code 75
    # trainer_state.json (the log history `riskpo-plot` reads) lands in output_dir even with save_strategy "no".
    trainer.save_state()

    trainer.save_model(training_args.output_dir)
    local = script_args.dataset_files
    if script_args.dataset_kind == "directory":
        local = [script_args.dataset_name]
    card_fields = {"dataset_name": hub_datasets(script_args), "dataset_files": local}  # local data: named, not linked
    trainer.create_model_card(**card_fields)
    if training_args.push_to_hub:
        trainer.push_to_hub(**card_fields)  # writes the card again, with the same fields
    trainer.accelerator.print(f"Saved the model and its card to {training_args.output_dir}.")
    trainer.accelerator.end_training()  # close trackers and the process group (what transformers' Trainer.end does)
    return trainer


def cli(argv: Sequence[str] | None = None) -> None:
    """The ``riskpo-train`` console script: a mistake in the options, the recipe, the data or the model path is one
    ``riskpo-train: error:`` line and exit code 2 (a bare ``--debug`` shows its traceback); training itself is not
    wrapped, so a crash keeps its traceback."""
    argv_given = argv
    argv, debug = pop_debug_flag(sys.argv[1:] if argv is None else argv)
    from ..job.library_warnings import drop_deepspeed_cpu_notice, ignore_library_default_warnings

    drop_deepspeed_cpu_notice()  # before parsing: building the config already warns
    ignore_library_default_warnings()  # for the whole run: what the trainers silence while they build and train
    try:
        with contextlib.ExitStack() as held:
            with usage_errors("riskpo-train", debug, (*USAGE_ERRORS, ImportError)):  # ImportError: use_vllm, report_to
                finished = check_before_imports(argv)  # each mistake that needs no model, before torch and TRL load
                if finished is not None:
                    print(finished)
                    return
                script_args, training_args, model_args = parse_args(argv)
                from ..job.run_lock import lock_output_dir
                from .cpu_threads import use_default_cpu_threads

                use_default_cpu_threads(training_args.use_cpu)
                check_tiny_model_path(script_args, model_args.model_name_or_path)
                held.enter_context(lock_output_dir(training_args.output_dir))
                trainer, checkpoint = prepare(script_args, training_args, model_args)
            if trainer is not None:
                # Run as a script (not called by a test): a stopped run's process exits soon after its stop line.
                train_and_save(trainer, script_args, training_args, checkpoint, exit_after_stop=argv_given is None)
    except SystemExit as stopped:
        end_process = getattr(stopped, "end_process", None)  # a stopped run of this script's own process
        if end_process is not None:
            end_process()  # the run lock is released: nothing is left to do
        raise


if __name__ == "__main__":
    cli()
