r"""Dataset adapters: the paper's training sets and benchmarks mapped to the trainer's columns.

Every adapter turns a dataset in its Hub schema into rows with

- ``problem`` (str): the question;
- ``answer`` (str): the gold final answer, e.g. ``"72"`` or ``"\frac{1}{2}"``;
- ``prompt`` (list of messages): ``problem`` followed by :data:`PROMPT_TEMPLATE`'s instruction, in TRL's
  conversational format (``prompt_template="authors"``: the RiskPO authors' prompt instead, see
  :data:`riskpo_trl.data.prompts.PROMPT_BUILDERS`);
- ``solution`` (str): the same gold answer, under the name the math rewards read (``solution=`` keyword);
- ``data_source`` (str): the source dataset's Hub id, which ``verl_by_source`` grades by, as verl does.

Use :func:`load_train_dataset` for training sets, :func:`load_benchmark` for evaluation sets; both take
``data_files=`` to read local JSON/JSONL/Parquet files written in the same schema instead of the Hub (offline runs,
tests, the bundled ``examples/data/tiny_arithmetic.jsonl``). :func:`adapt_dataset` maps an already loaded dataset.

The code and multi-modal tracks have rows of another shape (``prompt`` + ``tests``; ``prompt`` + ``images`` +
``solution``), made by their own loaders. :mod:`riskpo_trl.tracks`, on the floor above, adds them to the same
registries as :class:`LoaderSpec` entries, so every dataset is picked by name the same way and this module never
imports a track.

The column names of each source were looked up in public code that loads it (the reference is next to each spec),
not guessed; a dataset without the expected columns fails with an error naming the column.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
from datasets import Dataset, Features, Value, concatenate_datasets

from ..registry import Registry
from ..rewards.grading import last_boxed
from .columns import answer_text, gsm8k_answer, map_training_columns
from .isolated_build import load_dataset_isolated
from .local_files import load_local_files
from .prompts import DEFAULT_PROMPT_TEMPLATE, PROMPT_BUILDERS, check_not_raw
from .user_datasets import HUB, apply_prompt_template, load_user_dataset, tracks_hint, user_dataset_kind

logger = logging.getLogger(__name__)

ADAPTED_COLUMNS = ("problem", "answer", "prompt", "solution", "data_source")
# Explicit types: a source column named like an output one (e.g. a numeric "answer") must not impose its type.
ADAPTED_FEATURES = Features(
    {
        "problem": Value("string"),
        "answer": Value("string"),
        "prompt": [{"role": Value("string"), "content": Value("string")}],
        "solution": Value("string"),
        "data_source": Value("string"),
    }
)


# --- answer extraction, one per schema ----------------------------------------------------------------------------


def boxed_answer(solution: str) -> str:
    """MATH: the final answer is the last ``\\boxed{}`` of the worked solution ("" if there is none)."""
    return (last_boxed(solution) or "").strip()


# DAPO-Math-17k ships its own instruction around each problem (Answer: ... format); we swap it for PROMPT_TEMPLATE's
# unless prompt_template="authors" keeps it (dapo_own_prompt).
DAPO_INSTRUCTION_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_INSTRUCTION_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def dapo_problem(prompt: list[dict[str, str]]) -> str:
    """DAPO-Math-17k: the problem inside the first (user) message, without DAPO's own answer-format instruction."""
    content = prompt[0]["content"]
    return content.removeprefix(DAPO_INSTRUCTION_PREFIX).removesuffix(DAPO_INSTRUCTION_SUFFIX).strip()


def dapo_own_prompt(prompt: list[dict[str, str]]) -> list[dict[str, str]]:
    """DAPO-Math-17k: the dataset's prompt as it is, its instruction included (what the authors' DAPO runs used)."""
    return [{"role": message["role"], "content": message["content"]} for message in prompt]


def dapo_answer(reward_model: dict[str, Any]) -> str:
    """DAPO-Math-17k: the gold answer is ``reward_model["ground_truth"]``."""
    return answer_text(reward_model["ground_truth"])


# --- registry ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset lives and which of its columns hold the problem and the gold answer."""

    hub_id: str
    split: str
    problem_column: str
    answer_column: str
    get_problem: Callable[[Any], str] = str
    get_answer: Callable[[Any], str] = answer_text
    config_name: str | None = None
    dedupe: bool = False  # drop repeated problems (keep the first)
    # The dataset's own prompt from the problem column's value, for prompt_template="authors"; None: it has none.
    own_prompt: Callable[[Any], list[dict[str, str]]] | None = None
    kind: str = "math"  # how its completions are graded (riskpo_trl.evaluation.scorers)

    @property
    def required_columns(self) -> tuple[str, str]:
        return (self.problem_column, self.answer_column)


@dataclass(frozen=True)
class LoaderSpec:
    """A dataset made by its own loader, for rows that are not problem/answer pairs (code tests, images).

    ``load(split, data_files)`` returns the dataset in the trainer's columns; with ``data_files`` it reads local files
    in the Hub schema instead of the Hub, like :class:`DatasetSpec` datasets.
    """

    hub_id: str
    split: str
    load: Callable[[str, str | Sequence[str] | None], Dataset]
    kind: str  # how its completions are graded: "code" (tests in the sandbox), "geometry" (the math verifier)


def add_dataset(registry: Registry[DatasetSpec | LoaderSpec], name: str, spec: DatasetSpec | LoaderSpec) -> None:
    """Register ``spec`` as ``name`` in ``registry``, helped by where it lives."""
    registry.add(name, spec, help=f"{spec.hub_id}, {spec.split} split")


def _registry(field: str, specs: dict[str, DatasetSpec | LoaderSpec]) -> Registry[DatasetSpec | LoaderSpec]:
    """A registry of ``specs``; more entries: :func:`add_dataset`."""
    registry: Registry[DatasetSpec | LoaderSpec] = Registry(field)
    for name, spec in specs.items():
        add_dataset(registry, name, spec)
    return registry


TRAIN_DATASETS = _registry(
    "dataset_name",
    {
        # prompt: [{"role": "user", "content": <DAPO instruction + problem>}], reward_model: {"style", "ground_truth"},
        # plus data_source / ability / extra_info (verl format). Schema: the dataset card as quoted by
        # AISBench's dapo_math README, and loaders reading prompt[0]["content"] / reward_model["ground_truth"].
        # The released file repeats its ~17k problems about 100 times (1.79M rows;
        # github.com/BytedTsinghua-SIA/DAPO/issues/36), hence dedupe.
        "dapo_math": DatasetSpec(
            "BytedTsinghua-SIA/DAPO-Math-17k",
            "train",
            "prompt",
            "reward_model",
            dapo_problem,
            dapo_answer,
            dedupe=True,
            own_prompt=dapo_own_prompt,
        ),
        # problem / level / type / solution (worked, final answer boxed); train 7.5k, test 5k. Schema: the
        # competition_math feature list (TFDS community catalog), which MATH-lighteval mirrors.
        "math": DatasetSpec(
            "DigitalLearningGmbH/MATH-lighteval", "train", "problem", "solution", get_answer=boxed_answer
        ),
        # question / answer (worked, "#### <number>" at the end), config "main". Schema: TRL/open-r1 style loaders
        # and the dataset card.
        "gsm8k": DatasetSpec(
            "openai/gsm8k", "train", "question", "answer", get_answer=gsm8k_answer, config_name="main"
        ),
    },
)

# The paper's second setting trains on MATH and GSM8K together.
TRAIN_MIXTURES: Registry[tuple[str, ...]] = Registry("dataset_name")
TRAIN_MIXTURES.add("math_gsm8k", ("math", "gsm8k"), help="MATH and GSM8K together, the paper's easy-level setting")

BENCHMARKS = _registry(
    "benchmark",
    {
        # id / problem / solution / answer / url / year; one "train" split of 30 problems (loaders in rllm, nemo-rl).
        "aime24": DatasetSpec("HuggingFaceH4/aime_2024", "train", "problem", "answer"),
        # problem / answer (plus id); split "test" (loaders in lighteval custom tasks and several eval harnesses).
        "aime25": DatasetSpec("math-ai/aime25", "test", "problem", "answer"),
        # AMC: two sets go by this name. The paper's appendix calls its set "AMC23" but gives 83 problems, the size of
        # AI-MO/aimo-validation-amc (AMC 12 2022 + 2023), so its table most likely used that one; this is not certain.
        # "amc": id / problem / answer (float64) / url; one "train" split of 83 problems (dataset card; eval loaders that
        # filter it on url).
        "amc": DatasetSpec("AI-MO/aimo-validation-amc", "train", "problem", "answer"),
        # "amc23": AMC 2023 only, 40 problems, as most eval harnesses name it. question / answer (may be numeric); split
        # "test" (grpo eval configs, lighteval tasks).
        "amc23": DatasetSpec("math-ai/amc23", "test", "question", "answer"),
        # problem / solution / answer / subject / level / unique_id; split "test".
        "math500": DatasetSpec("HuggingFaceH4/MATH-500", "test", "problem", "answer"),
        # question / answer; split "test", 272 problems (lighteval's minerva_math task reads these columns).
        "minerva": DatasetSpec("math-ai/minervamath", "test", "question", "answer"),
        # question / final_answer (a list of LaTeX strings like ["$2^{1009}$"]) / solution / ...; split "test".
        "olympiadbench": DatasetSpec("math-ai/olympiadbench", "test", "question", "final_answer"),
        # The easy-level setting is evaluated on the original test splits of its training sets.
        "math": DatasetSpec(
            "DigitalLearningGmbH/MATH-lighteval", "test", "problem", "solution", get_answer=boxed_answer
        ),
        "gsm8k": DatasetSpec(
            "openai/gsm8k", "test", "question", "answer", get_answer=gsm8k_answer, config_name="main"
        ),
    },
)

# The paper's hard-level table, in its column order ("amc": the 83-problem set its appendix describes).
HARD_MATH_BENCHMARKS = ("aime25", "aime24", "amc", "math500", "minerva", "olympiadbench")


# --- adapters ---------------------------------------------------------------------------------------------------


def _require_columns(dataset: Dataset, columns: Sequence[str], name: str) -> None:
    missing = [column for column in columns if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"Dataset {name!r} is missing the column(s) {missing} that its adapter reads; found "
            f"{dataset.column_names}. Check the dataset id/files, or pick the adapter matching its schema."
        )


def check_prompt_template(prompt_template: str) -> None:
    """Raise naming the valid choices if ``prompt_template`` is not one of :data:`PROMPT_BUILDERS`."""
    PROMPT_BUILDERS.check(prompt_template)


def adapt_dataset(
    dataset: Dataset, spec: DatasetSpec, name: str = "dataset", prompt_template: str = DEFAULT_PROMPT_TEMPLATE
) -> Dataset:
    """Map ``dataset`` (in ``spec``'s schema) to the columns problem / answer / prompt / solution / data_source,
    nothing else.

    ``prompt_template`` picks the prompt: ``"qwen_boxed"`` (:data:`PROMPT_TEMPLATE`) or ``"authors"`` (the dataset's
    own prompt where it has one, DAPO-Math-17k's; else the authors' MATH/GSM8K instruction). Rows whose gold answer
    cannot be extracted (e.g. a MATH solution without ``\\boxed{}``) are dropped, with a warning: they could only
    ever be scored None.
    """
    check_prompt_template(prompt_template)
    check_not_raw(prompt_template, name)
    _require_columns(dataset, spec.required_columns, name)
    keep_own_prompt = prompt_template == "authors" and spec.own_prompt is not None
    build_prompt = PROMPT_BUILDERS[prompt_template]

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        problem = spec.get_problem(row[spec.problem_column])
        answer = spec.get_answer(row[spec.answer_column])
        prompt = spec.own_prompt(row[spec.problem_column]) if keep_own_prompt else build_prompt(problem)
        return {"problem": problem, "answer": answer, "prompt": prompt, "solution": answer, "data_source": spec.hub_id}

    adapted = dataset.map(
        convert, remove_columns=dataset.column_names, features=ADAPTED_FEATURES, desc=f"Adapting {name}"
    )
    keep = [i for i, (problem, answer) in enumerate(zip(adapted["problem"], adapted["answer"])) if problem and answer]
    if len(keep) < len(adapted):
        logger.warning("%s: dropped %d rows without a problem or gold answer.", name, len(adapted) - len(keep))
        adapted = adapted.select(keep)
    if spec.dedupe:
        first_seen: dict[str, int] = {}
        for i, problem in enumerate(adapted["problem"]):
            first_seen.setdefault(problem, i)
        if len(first_seen) < len(adapted):
            adapted = adapted.select(sorted(first_seen.values()))
    return adapted


def _load_raw(spec: DatasetSpec, split: str | None, data_files: str | Sequence[str] | None) -> Dataset:
    if data_files is not None:
        return load_local_files(data_files)
    return load_dataset_isolated(spec.hub_id, spec.config_name, split=split or spec.split)


class DatasetUnavailableError(ConnectionError):
    """A Hub dataset is neither in the local cache nor reachable on the Hub (offline machine or no network); a
    ConnectionError (an OSError), which the console scripts report as one line."""


def _load_spec(
    spec: DatasetSpec | LoaderSpec,
    name: str,
    split: str | None,
    data_files: str | Sequence[str] | None,
    local_form: str = "data_files=PATH",
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
) -> Dataset:
    """Load a registered dataset; ``local_form`` is how the caller's user names local files instead (for the error
    raised when the Hub cannot be reached)."""
    check_prompt_template(prompt_template)
    check_not_raw(prompt_template, name)
    if isinstance(spec, LoaderSpec) and prompt_template != DEFAULT_PROMPT_TEMPLATE:
        raise ValueError(
            f"prompt_template={prompt_template!r} applies to the math datasets; {name!r} ({spec.kind} track) builds "
            f"its own prompts. Leave prompt_template at {DEFAULT_PROMPT_TEMPLATE!r} for it."
        )
    try:
        if isinstance(spec, LoaderSpec):
            return spec.load(split or spec.split, data_files)
        raw = _load_raw(spec, split, data_files)
    except ConnectionError as error:  # what `datasets` raises offline, after its retries without a network
        if data_files is not None:
            raise
        raise DatasetUnavailableError(
            f"{name!r} ({spec.hub_id} on the Hugging Face Hub) is not available offline: it is not in the local "
            f"datasets cache and the Hub cannot be reached ({error}). Read local JSON/JSONL/Parquet files in its Hub "
            f"schema instead: {local_form}." + _offline_hint()
        ) from None
    return adapt_dataset(raw, spec, name, prompt_template)


def _lookup(
    registry: Registry[DatasetSpec | LoaderSpec], name: str, extra: Sequence[str] = ()
) -> DatasetSpec | LoaderSpec:
    registry.check_all([name], also=extra, otherwise=tracks_hint())
    return registry[name]


def load_train_dataset(
    name: str,
    split: str = "train",
    data_files: str | Sequence[str] | None = None,
    limit: int | None = None,
    seed: int = 0,
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
    config: str | None = None,
    prompt_column: str | None = None,
    answer_column: str | None = None,
) -> Dataset:
    """A training set: one of :data:`TRAIN_DATASETS` or :data:`TRAIN_MIXTURES` in the trainer's columns, or any
    other dataset as it is (a Hub id, a local dataset directory, or ``json``/``csv``/``parquet`` with ``data_files``;
    see :mod:`riskpo_trl.data.user_datasets`), ``config`` naming its configuration.

    For a registered dataset ``data_files`` reads local files in its schema instead of the Hub. ``limit`` keeps the
    first rows. ``prompt_template`` picks the prompt of a registered dataset (see :func:`adapt_dataset`).
    ``prompt_column`` and ``answer_column`` name the columns of a dataset used as it is that hold the prompt and the
    gold answer, read as ``prompt`` and ``solution`` (:mod:`riskpo_trl.data.columns`); a text prompt becomes a user
    turn with ``prompt_template``'s instruction, the prompt the registered datasets give (``raw``: kept as text).
    A mixture is shuffled with ``seed`` first, so its first rows draw from every part (concatenated in order, a limit
    would keep only the first part's rows); the trainer reshuffles each epoch anyway.
    """
    if name not in TRAIN_DATASETS and name not in TRAIN_MIXTURES:
        where = f"the training dataset {name!r}"
        dataset = _load_user_dataset(name, config, split, data_files)
        dataset = map_training_columns(dataset, prompt_column, answer_column, where=where)
        dataset = apply_prompt_template(dataset, prompt_template, where)
    elif prompt_column is not None or answer_column is not None:
        raise ValueError(
            f"prompt_column and answer_column name the columns of a dataset used as it is; {name!r} is "
            "registered and its adapter maps its columns. Remove them."
        )
    elif name in TRAIN_MIXTURES:
        if data_files is not None:
            raise ValueError(
                f"{name!r} mixes several Hub datasets; data_files only works with one of {list(TRAIN_DATASETS)}."
            )
        parts = [load_train_dataset(part, split, prompt_template=prompt_template) for part in TRAIN_MIXTURES[name]]
        dataset = concatenate_datasets(parts).shuffle(seed=seed).flatten_indices()
    else:
        spec = _lookup(TRAIN_DATASETS, name, extra=TRAIN_MIXTURES)
        local_form = "`dataset_files: [PATH]` in the recipe (`--dataset_files PATH`)"
        dataset = _load_spec(spec, name, split, data_files, local_form, prompt_template)
    return dataset.select(range(min(limit, len(dataset)))) if limit is not None else dataset


def _load_user_dataset(name: str, config: str | None, split: str, data_files: str | Sequence[str] | None) -> Dataset:
    """A dataset that is not registered, as it is; a Hub id that cannot be reached is one line, as for registered
    ones."""
    kind = user_dataset_kind(name, data_files, [*TRAIN_DATASETS, *TRAIN_MIXTURES])
    try:
        return load_user_dataset(name, kind, config, split, data_files)
    except ConnectionError as error:
        if kind != HUB:
            raise
        raise DatasetUnavailableError(
            f"{name!r} is not available offline: it is not in the local datasets cache and the Hugging Face Hub "
            f"cannot be reached ({error}). Save it with save_to_disk where the Hub is reachable and give that "
            f"directory as dataset_name, or give its files: dataset_name json (csv, parquet) with dataset_files."
            + _offline_hint()
        ) from None


def _offline_hint() -> str:
    return "" if datasets.config.HF_HUB_OFFLINE else " Without a network, set HF_HUB_OFFLINE=1 to fail at once."


def load_benchmark(
    name: str,
    split: str | None = None,
    data_files: str | Sequence[str] | None = None,
    limit: int | None = None,
    prompt_template: str = DEFAULT_PROMPT_TEMPLATE,
) -> Dataset:
    """An evaluation set from :data:`BENCHMARKS`: math ones with columns problem, answer, prompt, solution (=
    answer) and data_source, prompted as ``prompt_template`` says; the code and multi-modal ones in their loader's
    columns."""
    spec = _lookup(BENCHMARKS, name)
    local_form = f"`riskpo-eval --benchmarks {name}=PATH` (`load_benchmark({name!r}, data_files=PATH)`)"
    dataset = _load_spec(spec, name, split, data_files, local_form, prompt_template)
    return dataset.select(range(min(limit, len(dataset)))) if limit is not None else dataset
