"""Training sets and benchmarks: a registry of datasets (``datasets``), the prompts they are rendered with
(``prompts``) and local files read instead of the Hub (``local_files``). ``from riskpo_trl.data import ...`` gives the
public names of all three; they load on first use, so the prompts alone (``--help``) do not load ``datasets``."""

from typing import Any

_SOURCES = {
    **dict.fromkeys((
        "ADAPTED_COLUMNS", "ADAPTED_FEATURES", "BENCHMARKS", "DAPO_INSTRUCTION_PREFIX", "DAPO_INSTRUCTION_SUFFIX",
        "DatasetSpec", "DatasetUnavailableError", "HARD_MATH_BENCHMARKS", "LoaderSpec", "TRAIN_DATASETS",
        "TRAIN_MIXTURES", "adapt_dataset", "answer_text", "boxed_answer", "check_prompt_template", "dapo_answer",
        "dapo_own_prompt", "dapo_problem", "gsm8k_answer", "load_benchmark", "load_train_dataset",
    ), "datasets"),
    **dict.fromkeys((
        "AUTHORS_INSTRUCTION", "DEFAULT_PROMPT_TEMPLATE", "PROMPT_BUILDERS", "PROMPT_TEMPLATE", "make_authors_prompt",
        "make_prompt",
    ), "prompts"),
    "load_local_files": "local_files",
}
__all__ = sorted(_SOURCES)


def __getattr__(name: str) -> Any:
    if name in _SOURCES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_SOURCES[name]}"), name)
    raise AttributeError(f"module 'riskpo_trl.data' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
