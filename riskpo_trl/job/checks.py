"""The trainer's start-up checks, run once by :func:`check_start_up` before anything loads: a misspelled keyword, a
model path that does not exist, the dataset columns TRL and the reward functions read, and a training set too small
for one generation batch each fail with a message that names them, rather than as a KeyError inside TRL at the first
step, a Hub lookup that blames the network, or a run that trains 0 steps and exits as if it had succeeded. A tiny
random model built by this package gets a one-line warning."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..registry import closest_name

# Keyword arguments GRPOTrainer passes to reward functions itself; every other one is read from a dataset column.
TRL_REWARD_KWARGS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)


def check_dataset_columns(
    train_dataset: Any, eval_dataset: Any, reward_funcs: Any, environment_factory: Any = None
) -> None:
    """Check that the training and evaluation datasets (a dataset, a dict of them, or None) have the columns
    GRPOTrainer reads and the columns each reward function reads, and pass each reward function's own
    ``check_dataset(dataset)`` if it has one; raise a ValueError naming what is missing and how to add it.

    What GRPOTrainer reads: each example's ``prompt``, except with an ``environment_factory``, where the environment's
    ``reset()`` supplies the prompt and ``prompt`` is optional; with a dict of environments, the ``environment`` column
    that routes each example to one of them."""
    _check_split(train_dataset, reward_funcs, environment_factory, "training")
    named = eval_dataset.items() if isinstance(eval_dataset, dict) else [("", eval_dataset)]
    for name, dataset in named:
        _check_split(dataset, reward_funcs, environment_factory, f"evaluation{f' ({name})' if name else ''}")


def reward_columns(reward_func: Any) -> list[str]:
    """Dataset columns a reward function needs: an explicit ``required_columns`` attribute, else the parameters of its
    signature that have no default and that GRPOTrainer does not pass itself."""
    declared = getattr(reward_func, "required_columns", None)
    if declared is not None:
        return list(declared)
    if not callable(reward_func) or isinstance(reward_func, str) or hasattr(reward_func, "config"):
        return []  # a Hub id or a reward model: it reads the text only
    try:
        parameters = inspect.signature(reward_func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.name not in TRL_REWARD_KWARGS
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]


def check_generation_batch_fits(train_dataset: Any, args: Any) -> None:
    """Refuse a training set with fewer examples than one generation batch takes.

    TRL's sampler (``RepeatSampler``) cuts the shuffled dataset into generation batches of
    ``generation_batch_size // num_generations`` prompts, over all processes, and drops an incomplete last one; with
    fewer examples than that an epoch is empty and the run trains 0 steps (repeating epochs for ``max_steps`` does
    not help). A dataset without a length (an ``IterableDataset``) cannot be counted here; the trainer checks after
    training that a step was taken."""
    if train_dataset is None or not hasattr(train_dataset, "__len__"):
        return
    rows = len(train_dataset)
    prompts = args.generation_batch_size // args.num_generations
    if rows >= prompts:
        return
    processes = args.world_size
    per_step = args.per_device_train_batch_size * processes
    raise ValueError(
        f"The training dataset has {rows} example{'s' if rows != 1 else ''}, fewer than the {prompts} prompts one "
        f"generation batch takes, so the run would train 0 steps (TRL drops an incomplete generation batch). A "
        f"generation batch is generation_batch_size={args.generation_batch_size} completions = "
        f"per_device_train_batch_size={args.per_device_train_batch_size} x {processes} process"
        f"{'es' if processes != 1 else ''} x steps_per_generation={args.steps_per_generation}, that is "
        f"{prompts} prompts of num_generations={args.num_generations} completions. Add examples, or shrink the "
        f"generation batch: lower steps_per_generation (or gradient_accumulation_steps="
        f"{args.gradient_accumulation_steps}, from which the config derives it when unset), lower "
        f"per_device_train_batch_size, raise num_generations, or run on fewer processes."
        + _fitting_schedule(rows, args, per_step)
    )


def _fitting_schedule(rows: int, args: Any, completions_per_step: int) -> str:
    """' For example, steps_per_generation=S fits: ...' for the largest steps_per_generation whose generation batch
    fits ``rows`` and holds whole prompt groups and bundle groups; when none does with the config's bundle_size (and
    gradient_accumulation_steps), a bundle_size (and gradient_accumulation_steps) that fits along with it. For a
    RiskPOConfig, also the drop-in path from a GRPO script, ``RiskPOConfig.from_grpo_config``."""
    bundled = hasattr(args, "bundle_size")
    accumulation = args.gradient_accumulation_steps
    fit = _largest_fit(rows, args, completions_per_step, change_bundle=False, change_accumulation=False)
    if fit is not None:
        return _describe_fit(*fit, changed=("steps_per_generation",)) + _from_grpo_hint(rows, args)
    attempts = [(True, False), (True, True)] if bundled else [(False, True)]
    for change_bundle, change_accumulation in attempts:
        fit = _largest_fit(rows, args, completions_per_step, change_bundle, change_accumulation)
        if fit is not None:
            break
    else:
        return _from_grpo_hint(rows, args)
    steps, ga, fit_bundle, prompts = fit
    changed = (
        "steps_per_generation",
        *(["gradient_accumulation_steps"] if change_accumulation else []),
        *(["bundle_size"] if change_bundle else []),
    )
    held = [f"bundle_size={args.bundle_size}"] if bundled else []
    held += [f"gradient_accumulation_steps={accumulation}"] if change_accumulation else []
    return (
        f" No steps_per_generation fits {' with '.join(held)} and {rows} example{'s' if rows != 1 else ''}."
        + _describe_fit(steps, ga, fit_bundle, prompts, changed=changed)
        + _from_grpo_hint(rows, args)
    )


def _largest_fit(
    rows: int, args: Any, completions_per_step: int, change_bundle: bool, change_accumulation: bool
) -> tuple[int, int, int, int] | None:
    """``(steps_per_generation, gradient_accumulation_steps, bundle_size, prompts)`` of the largest generation batch
    below the config's that fits ``rows`` as whole prompt groups, whole bundle groups and whole optimizer updates,
    changing only what the flags allow (a changed bundle_size or gradient_accumulation_steps: the largest divisor
    that fits, at most the config's); None if there is none."""
    bundle = getattr(args, "bundle_size", 1)
    for steps in range(args.steps_per_generation - 1, 0, -1):
        accumulation = args.gradient_accumulation_steps
        if change_accumulation:
            accumulation = _largest_divisor_at_most(steps, accumulation)
        prompts, leftover = divmod(completions_per_step * steps, args.num_generations)
        if leftover or steps % accumulation or not 0 < prompts <= rows:
            continue
        fit_bundle = _largest_divisor_at_most(prompts, bundle) if change_bundle else bundle
        if prompts % fit_bundle == 0:
            return steps, accumulation, fit_bundle, prompts
    return None


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def _describe_fit(steps: int, accumulation: int, bundle: int, prompts: int, changed: tuple[str, ...]) -> str:
    values = {"steps_per_generation": steps, "gradient_accumulation_steps": accumulation, "bundle_size": bundle}
    settings = [f"{name}={values[name]}" for name in changed]
    listed = settings[0] if len(settings) == 1 else ", ".join(settings[:-1]) + " and " + settings[-1]
    updates = steps // accumulation
    return (
        f" For example, {listed} fit{'s' if len(settings) == 1 else ''}: {prompts} prompts per generation batch, "
        f"taken in {updates} optimizer update{'s' if updates != 1 else ''}."
    )


def _from_grpo_hint(rows: int, args: Any) -> str:
    """For a RiskPOConfig: ``RiskPOConfig.from_grpo_config`` keeps a GRPO config's schedule, by default one
    generation batch per optimizer step (``gradient_accumulation_steps=1``), which takes fewer prompts than
    RiskPOConfig's default of four updates per generation batch; with a bundle_size that fits it, when there is one."""
    bundle = getattr(args, "bundle_size", None)
    if bundle is None:
        return ""
    prompts, leftover = divmod(args.per_device_train_batch_size * args.world_size, args.num_generations)
    if leftover or not 0 < prompts <= rows:
        return ""
    fit_bundle = _largest_divisor_at_most(prompts, bundle)
    return (
        " From a GRPO script, RiskPOConfig.from_grpo_config(grpo_config, bundle_size=...) is the drop-in path: it "
        "keeps the GRPO config's generation schedule, by default one generation batch per optimizer step ("
        f"{prompts} prompt{'s' if prompts != 1 else ''} here with per_device_train_batch_size="
        f"{args.per_device_train_batch_size}{f' on {args.world_size} processes' if args.world_size > 1 else ''} and "
        f"num_generations={args.num_generations}), e.g. "
        f"args = RiskPOConfig.from_grpo_config(GRPOConfig(output_dir=..., per_device_train_batch_size="
        f"{args.per_device_train_batch_size}, num_generations={args.num_generations}), bundle_size={fit_bundle})."
    )


def _check_split(dataset: Any, reward_funcs: Any, environment_factory: Any, split: str) -> None:
    """Fail at construction, naming the columns, rather than with a KeyError inside TRL at the first step."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None:  # no dataset, or a streaming one that does not know its columns
        return
    if environment_factory is None and "prompt" not in columns:
        raise ValueError(missing_prompt_message(split, columns))
    if isinstance(environment_factory, dict) and "environment" not in columns:
        raise ValueError(
            f"The {split} dataset has no 'environment' column (its columns: {columns}). With a dict of environments "
            f"({sorted(environment_factory)}), GRPOTrainer routes each example to the environment its 'environment' "
            "column names. Add that column, or pass a single environment factory."
        )
    funcs: list[Callable] = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    for func in funcs:
        name = getattr(func, "__name__", type(func).__name__)
        missing = [column for column in reward_columns(func) if column not in columns]
        if missing:
            raise ValueError(
                f"The reward function {name} reads the column(s) {missing}, which the {split} dataset lacks (its "
                f"columns: {columns}). Add them to the dataset (e.g. the reference answer as 'solution'; riskpo-train's "
                "--answer_column NAME reads it from another column), or use a reward function that fits it."
            )
        check = getattr(func, "check_dataset", None)
        if check is not None and hasattr(dataset, "unique"):
            try:
                check(dataset)
            except ValueError as error:
                raise ValueError(f"The {split} dataset does not fit the reward function {name}: {error}") from None


def missing_prompt_message(split: str, columns: list[str]) -> str:
    return (
        f"The {split} dataset has no 'prompt' column (its columns: {columns}). RiskPOTrainer, like GRPOTrainer, "
        "reads each example's prompt from 'prompt': a string, or a list of chat messages [{'role': 'user', "
        "'content': ...}]. Rename or build that column (e.g. dataset.rename_column('question', 'prompt'), "
        "riskpo-train's --prompt_column question, or the adapters in riskpo_trl.data)."
    )


# --- model names that are local paths, not Hub ids: said at once, instead of a Hub lookup that retries for half a
# minute and then blames the network


def reads_as_local_path(name: str) -> bool:
    """Whether ``name`` can only mean a local directory: absolute, ``./``, ``../`` or ``~``, not of the Hub's
    ``namespace/name`` form, or under a directory that exists here (``outputs/no-such-model`` next to ``outputs/``)."""
    if os.path.isabs(name) or name.startswith((".", "~")) or os.sep != "/" and os.sep in name:
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    head, _, _ = name.partition("/")
    return bool(_) and os.path.isdir(head)


def hub_id_or_none(name: str | None) -> str | None:
    """``name`` if it reads as a Hub repository id and is not a local path, else None."""
    if not name or os.path.exists(name) or reads_as_local_path(name):
        return None
    return name


def check_model_path(name: str, what: str = "model") -> None:
    """Raise FileNotFoundError for a ``name`` that reads as a local path (see `reads_as_local_path`) but does not
    exist, naming it as such; a Hub id or an existing path passes."""
    if os.path.exists(name) or not reads_as_local_path(name):
        return
    parent = os.path.dirname(os.path.abspath(os.path.expanduser(name)))
    hint = (
        f" ({os.path.dirname(name)}/ exists here, so this is read as a local path)"
        if os.path.isdir(parent) and not os.path.isabs(name) and "/" in name
        else ""
    )
    raise FileNotFoundError(
        f"{what} {name!r}: no such directory, and not a Hub id{hint}. Give an existing directory (saved with "
        "save_pretrained) or a Hub id such as 'Qwen/Qwen2.5-Math-1.5B-Instruct'; riskpo-train's build_tiny_model: "
        "true builds a tiny random model at a missing path that can only be local, such as this one."
    )


# --- optional packages and the Hub, before the model loads: TRL and transformers find out only after it has loaded

# Packages of the report_to integrations whose pip name differs from the integration's name.
REPORTER_PACKAGES = {"azure_ml": "azureml-core", "comet_ml": "comet-ml", "flyte": "flytekit"}
# ... and whose transformers availability check (is_<name>_available) is named otherwise.
REPORTER_CHECKS = {"azure_ml": "azureml", "comet_ml": "comet", "flyte": "flytekit"}


def check_run_requirements(args: Any) -> None:
    """Raise, naming the setting and the fix, when ``use_vllm`` is set without vLLM installed, when a ``report_to``
    integration is not installed, or when ``push_to_hub`` is set and the Hub cannot be reached or no token is
    there."""
    import importlib.util

    if getattr(args, "use_vllm", False) and importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "use_vllm is true but vLLM is not installed: pip install 'riskpo-trl[vllm]' (the tested vLLM range), or "
            "set use_vllm false to generate with transformers."
        )
    for name in getattr(args, "report_to", None) or ():
        from transformers.integrations import integration_utils

        is_available = getattr(integration_utils, f"is_{REPORTER_CHECKS.get(name, name)}_available", None)
        if is_available is not None and not is_available():
            raise ImportError(
                f"report_to includes {name!r}, which is not installed: pip install "
                f"{REPORTER_PACKAGES.get(name, name)}, or leave it out of report_to ('none' logs to the console and "
                "trainer_state.json only)."
            )
    if getattr(args, "push_to_hub", False):
        check_hub_push(getattr(args, "hub_token", None))


def check_hub_push(token: str | None) -> None:
    """``push_to_hub`` needs the Hub and a token: say so at start-up rather than after the model has loaded."""
    from huggingface_hub import get_token

    from ..hub_access import hub_unreachable

    reason = hub_unreachable()
    if reason is not None:
        raise ConnectionError(
            f"push_to_hub is true but the Hugging Face Hub cannot be reached ({reason}). Set push_to_hub false (push "
            "later with `hf upload`), or run where the Hub is reachable."
        )
    if token is None and get_token() is None:
        raise PermissionError(
            "push_to_hub is true but no Hugging Face token is found: run `hf auth login`, set HF_TOKEN, or set "
            "hub_token; or set push_to_hub false."
        )


def check_model_available(name: str, what: str = "model") -> None:
    """`check_model_path`, and when the Hub cannot be reached (or ``HF_HUB_OFFLINE`` is set): a ``name`` that is no
    local directory and not in the local Hub cache is refused at once, as missing, rather than after the Hub's
    retries."""
    check_model_path(name, what)
    if os.path.exists(name):
        return
    from huggingface_hub import try_to_load_from_cache

    from ..hub_access import hub_unreachable

    reason = hub_unreachable()
    if reason is None:
        return
    if any(isinstance(try_to_load_from_cache(name, file), str) for file in ("config.json", "adapter_config.json")):
        return
    raise FileNotFoundError(
        f"{what} {name!r}: no such local directory, and not in the local Hub cache; the Hugging Face Hub cannot be "
        f"reached to look it up as a Hub id ({reason}). Give an existing directory, or download the model where the "
        "Hub is reachable."
    )


# --- all of them, once


def check_keywords(kwargs: dict[str, Any], trainer_class: type, base_class: type) -> None:
    """A misspelled keyword is named with the closest one ``base_class.__init__`` takes, before anything loads; an
    ``__init__`` that passes ``**kwargs`` on (TRL's ``GMPOTrainer``) takes those of the class it passes them to."""
    accepted: set[str] = set()
    for owner in (cls for cls in base_class.__mro__ if "__init__" in vars(cls)):
        parameters = inspect.signature(owner.__init__).parameters
        accepted |= {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            break
    accepted -= {"self", "model", "reward_funcs", "args"}
    for name in kwargs:
        if name not in accepted:
            raise TypeError(
                f"{trainer_class.__name__} got an unexpected keyword argument {name!r}{closest_name(name, accepted)}; "
                f"it takes {owner.__name__}'s: model, reward_funcs, args, {', '.join(sorted(accepted))}."
            )


def check_start_up(
    trainer_class: type, base_class: type, model: Any, reward_funcs: Any, args: Any, kwargs: dict[str, Any]
) -> None:
    """Every start-up check of a GRPO-family trainer's arguments (``kwargs``: the keywords besides ``model``,
    ``reward_funcs`` and ``args``)."""
    from ..trainer.config_checks import check_loss_type  # here: this module stays light for the early checks

    check_keywords(kwargs, trainer_class, base_class)
    check_loss_type(args)
    check_run_requirements(args)
    train_dataset = kwargs.get("train_dataset")
    check_dataset_columns(train_dataset, kwargs.get("eval_dataset"), reward_funcs, kwargs.get("environment_factory"))
    check_generation_batch_fits(train_dataset, args)
    if isinstance(model, str):
        check_model_path(model)
    from ..tiny_model import warn_if_tiny_random_model  # here: this module stays light for the scripts' early checks

    warn_if_tiny_random_model(model)
