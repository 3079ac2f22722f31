"""Training sets and benchmarks: a registry of datasets (``datasets``), the prompts they are rendered with
(``prompts``) and local files read instead of the Hub (``local_files``); datasets loaded by id have their cache built
in a child process first (``isolated_build``). ``from riskpo_trl.data import ...`` gives the public names of the first
three; they load on first use, so the prompts alone (``--help``) do not load ``datasets``."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "datasets": (
        "ADAPTED_COLUMNS",
        "ADAPTED_FEATURES",
        "BENCHMARKS",
        "DAPO_INSTRUCTION_PREFIX",
        "DAPO_INSTRUCTION_SUFFIX",
        "DatasetSpec",
        "DatasetUnavailableError",
        "HARD_MATH_BENCHMARKS",
        "LoaderSpec",
        "TRAIN_DATASETS",
        "TRAIN_MIXTURES",
        "adapt_dataset",
        "answer_text",
        "boxed_answer",
        "check_prompt_template",
        "dapo_answer",
        "dapo_own_prompt",
        "dapo_problem",
        "gsm8k_answer",
        "load_benchmark",
        "load_train_dataset",
    ),
    "prompts": (
        "AUTHORS_INSTRUCTION",
        "DEFAULT_PROMPT_TEMPLATE",
        "PROMPT_BUILDERS",
        "PROMPT_TEMPLATE",
        "RAW_PROMPT_TEMPLATE",
        "make_authors_prompt",
        "make_prompt",
        "prompt_from_text",
    ),
    "local_files": ("load_local_files",),
}

if TYPE_CHECKING:
    from .datasets import (
        ADAPTED_COLUMNS,
        ADAPTED_FEATURES,
        BENCHMARKS,
        DAPO_INSTRUCTION_PREFIX,
        DAPO_INSTRUCTION_SUFFIX,
        HARD_MATH_BENCHMARKS,
        TRAIN_DATASETS,
        TRAIN_MIXTURES,
        DatasetSpec,
        DatasetUnavailableError,
        LoaderSpec,
        adapt_dataset,
        answer_text,
        boxed_answer,
        check_prompt_template,
        dapo_answer,
        dapo_own_prompt,
        dapo_problem,
        gsm8k_answer,
        load_benchmark,
        load_train_dataset,
    )
    from .local_files import load_local_files
    from .prompts import (
        AUTHORS_INSTRUCTION,
        DEFAULT_PROMPT_TEMPLATE,
        PROMPT_BUILDERS,
        PROMPT_TEMPLATE,
        RAW_PROMPT_TEMPLATE,
        make_authors_prompt,
        make_prompt,
        prompt_from_text,
    )

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
