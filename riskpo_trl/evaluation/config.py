"""What ``riskpo-eval`` evaluates and how (:class:`EvalConfig`); light imports, so ``--help`` answers at once."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from ..data.prompts import DEFAULT_PROMPT_TEMPLATE, PROMPT_BUILDERS
from .metrics import default_ks
from .sampling import SamplingSettings

logger = logging.getLogger(__name__)

MAX_ADAPTER_CONFIG_BYTES = 1 << 20  # a PEFT adapter's config is a few kilobytes
ADAPTER_CONFIG = "adapter_config.json"  # what PEFT's save_pretrained writes into an adapter directory


@dataclass
class EvalConfig:
    """What to evaluate and how; also the command-line arguments of ``riskpo-eval``."""

    model: str = field(
        metadata={
            "help": "Model to evaluate: a local path or a Hub id. A local PEFT (LoRA) adapter directory (one "
            "with adapter_config.json) is loaded on the base model its adapter_config.json names."
        }
    )
    adapter: str | None = field(default=None, metadata={"help": "Optional PEFT (LoRA) adapter on top of `model`."})
    benchmarks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Benchmarks from riskpo_trl.data.BENCHMARKS: math (e.g. aime24 math500 gsm8k), code "
            "(livecodebench_v5, graded in the sandbox) or geometry (geometry3k_test, needs a vision-language "
            "model), loaded from the Hub; NAME=FILE reads local JSON/JSONL/Parquet rows in that benchmark's "
            "Hub schema instead."
        },
    )
    dataset_files: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Local JSON/JSONL files of rows with `problem` and `answer`, or riskpo-train's `prompt` "
            "(text or chat messages) and `solution` (see prompt_column, answer_column); each is one math "
            "benchmark named after the file."
        },
    )
    prompt_column: str | None = field(
        default=None,
        metadata={
            "help": "Column of the dataset_files rows that holds the prompt (text or chat messages), used as "
            "it is, as riskpo-train reads it. Default: 'prompt' if the rows have it, else 'problem' prompted "
            "with prompt_template."
        },
    )
    answer_column: str | None = field(
        default=None,
        metadata={
            "help": "Column of the dataset_files rows that holds the gold answer. Default: 'answer', else "
            "riskpo-train's 'solution'. GSM8K's '... #### 42' gives 42."
        },
    )
    prompt_template: str = field(
        default=DEFAULT_PROMPT_TEMPLATE,
        metadata={
            "help": "Instruction around each problem of the math benchmarks and of rows with `problem`: "
            "'qwen_boxed' or 'authors', as riskpo-train's prompt_template.",
            "choices": PROMPT_BUILDERS,
        },
    )
    output_dir: str = field(
        default="eval_results",
        metadata={
            "help": "Where samples.jsonl, results.json/.md go. If it already holds samples.jsonl, say what to "
            "do with them: --resume true or --overwrite true."
        },
    )
    num_samples: int = field(default=8, metadata={"help": "Completions sampled per problem (n)."})
    ks: list[int] | None = field(
        default=None, metadata={"help": "k's of Pass@k; each must be <= num_samples. Default: 1, 2, 4, ..., n."}
    )
    temperature: float = field(default=0.8, metadata={"help": "Sampling temperature (0 = greedy)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling threshold."})
    max_new_tokens: int = field(default=1024, metadata={"help": "Longest completion, in tokens."})
    max_problems: int | None = field(default=None, metadata={"help": "Evaluate only the first N problems of each."})
    backend: str = field(
        default="auto",
        metadata={
            "help": "'vllm' (offline engine), 'transformers' (model.generate) or 'auto' (vLLM when installed "
            "and a GPU is visible).",
            "choices": ["auto", "vllm", "transformers"],
        },
    )
    batch_size: int = field(default=8, metadata={"help": "Problems per generation call."})
    dtype: str = field(default="auto", metadata={"help": "Model dtype: auto, bfloat16, float16, float32."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    logprobs: bool = field(
        default=False,
        metadata={"help": "Also record each completion's mean token log-probability (for the entropy diagnostic)."},
    )
    code_sandbox: dict | str | None = field(
        default=None,
        metadata={
            "help": "Sandbox of the code benchmarks: executor, max_workers and riskpo_trl.code.SandboxLimits fields, as "
            "a JSON object (the `code_sandbox:` block of a training recipe)."
        },
    )
    vllm_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "More arguments of the vLLM engine (vllm.LLM), as a JSON object, e.g. "
            '\'{"max_model_len": 4096, "tensor_parallel_size": 2, "gpu_memory_utilization": 0.8}\'. '
            "The model, dtype and seed come from their own options."
        },
    )
    resume: bool = field(
        default=False,
        metadata={
            "help": "Keep the problems already scored in output_dir/samples.jsonl and sample only the rest "
            "(after a crash, or with more benchmarks)."
        },
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Delete output_dir/samples.jsonl from an earlier run and start over."}
    )
    # Where `model` came from, for messages: the option itself, or an adapter directory's base model.
    model_source: str = field(default="model", init=False, repr=False)

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"num_samples={self.num_samples} must be >= 1.")
        self.ks = sorted(set(self.ks)) if self.ks else default_ks(self.num_samples)
        too_large = [k for k in self.ks if k > self.num_samples]
        if too_large or min(self.ks) < 1:
            raise ValueError(
                f"ks={self.ks}: every k must be in [1, num_samples={self.num_samples}] (Pass@k needs k samples per "
                f"problem). Raise num_samples to {max(self.ks)} or drop k={too_large or [min(self.ks)]}."
            )
        if not self.benchmarks and not self.dataset_files:
            raise ValueError("Nothing to evaluate: give benchmarks (e.g. `--benchmarks math500`) or dataset_files.")
        if (self.prompt_column or self.answer_column) and not self.dataset_files:
            raise ValueError(
                "prompt_column and answer_column name columns of the dataset_files rows; the benchmarks "
                "are read by their adapters. Give dataset_files, or remove them."
            )
        PROMPT_BUILDERS.check(self.prompt_template)
        if self.resume and self.overwrite:
            raise ValueError(
                "resume=True keeps the samples already in output_dir and overwrite=True deletes them; set one of them."
            )
        self._split_adapter_directory()
        if isinstance(self.code_sandbox, str):  # from the command line
            self.code_sandbox = json.loads(self.code_sandbox)
        if isinstance(self.vllm_kwargs, str):
            try:
                self.vllm_kwargs = json.loads(self.vllm_kwargs)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"vllm_kwargs={self.vllm_kwargs!r} is not JSON ({error}); write a JSON object, "
                    """e.g. '{"max_model_len": 4096}'."""
                ) from error
        if self.vllm_kwargs is not None:
            if not isinstance(self.vllm_kwargs, dict):
                raise ValueError(f"vllm_kwargs={self.vllm_kwargs!r} must be a JSON object of vllm.LLM arguments.")
            own = sorted({"model", "dtype", "seed", "tokenizer"} & self.vllm_kwargs.keys())
            if own:
                raise ValueError(
                    f"vllm_kwargs sets {own}: give them with their own options (--model, --dtype, "
                    "--seed) so the results record them."
                )
            if self.backend == "transformers":
                raise ValueError(
                    "vllm_kwargs configures the vLLM engine, but backend='transformers'; drop it or "
                    "use backend='vllm'."
                )

    def _split_adapter_directory(self) -> None:
        """``model`` naming a PEFT adapter directory means: that adapter on the base model it was trained on."""
        adapter_config = os.path.join(self.model, ADAPTER_CONFIG)
        if not os.path.isfile(adapter_config) or os.path.isfile(os.path.join(self.model, "config.json")):
            return
        if self.adapter is not None:
            raise ValueError(
                f"model={self.model!r} is a PEFT adapter directory (it has {ADAPTER_CONFIG}) and "
                f"adapter={self.adapter!r} is set too; give the base model as --model and the adapter "
                "as --adapter."
            )
        from ..trainer.state_files import json_field, read_json_file

        config = read_json_file(adapter_config, MAX_ADAPTER_CONFIG_BYTES)  # no link, FIFO or device; bounded
        base = json_field(
            config if isinstance(config, dict) else {}, "base_model_name_or_path", (str, type(None)), adapter_config
        )
        if not base:
            raise ValueError(
                f"{adapter_config} names no base_model_name_or_path; give the base model as --model and "
                f"this directory as --adapter {self.model}."
            )
        logger.warning(
            f"{self.model} is a PEFT adapter: evaluating it on its base model {base} (from {ADAPTER_CONFIG})."
        )
        self.model, self.adapter = base, self.model
        self.model_source = (
            f"the base model of adapter {self.adapter!r} (base_model_name_or_path in its {ADAPTER_CONFIG})"
        )

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(
            num_samples=self.num_samples,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            return_logprobs=self.logprobs,
        )


@dataclass
class TrainingPassAtK:
    """Held-out Pass@k during ``riskpo-train``: the ``pass_at_k:`` block of a recipe (see docs/evaluation.md).

    The named benchmarks form one held-out set; every ``eval_steps`` optimizer steps (and at the start and the end)
    :class:`riskpo_trl.evaluation.PassAtKCallback` samples ``num_samples`` completions per problem and logs
    ``eval/pass@k`` for each ``k`` and ``eval/avg@n``.
    """

    benchmarks: list[str]  # math benchmarks of riskpo_trl.data.BENCHMARKS, or NAME=FILE (local rows in its schema)
    num_samples: int = 8
    ks: list[int] | None = None  # default: 1, 2, 4, ..., num_samples
    eval_steps: int = 50
    max_problems: int | None = None  # first N problems of each benchmark (sampling runs on the training model)
    max_new_tokens: int | None = None  # default: the trainer's max_completion_length
    temperature: float = 0.8
    top_p: float = 1.0
    batch_size: int = 8
    eval_on_start: bool = True

    @classmethod
    def from_block(cls, block: dict | str) -> TrainingPassAtK:
        """The settings of a recipe's ``pass_at_k:`` mapping (or its JSON form from the command line), checked:
        unknown keys, benchmark names and k's are reported by name before anything loads."""
        import dataclasses

        from ..registry import closest_name

        if isinstance(block, str):
            try:
                block = json.loads(block)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"pass_at_k={block!r} is not JSON ({error}); write a JSON object such as "
                    """'{"benchmarks": ["math500"], "ks": [1, 8], "num_samples": 8}'."""
                ) from error
        if not isinstance(block, dict):
            raise ValueError(
                f"pass_at_k must be a mapping of settings ({', '.join(cls.__dataclass_fields__)}), got {block!r}."
            )
        names = [field.name for field in dataclasses.fields(cls)]
        unknown = [f"{key}{closest_name(key, names)}" for key in block if key not in names]
        if unknown:
            raise ValueError(f"pass_at_k: unknown setting(s) {', '.join(unknown)}; it takes {', '.join(names)}.")
        if not block.get("benchmarks"):
            raise ValueError(
                "pass_at_k: name the held-out benchmarks, e.g. `benchmarks: [math500]` (or "
                "`[math500=path/to/rows.jsonl]` for local rows in that benchmark's Hub schema)."
            )
        settings = cls(**block)
        if isinstance(settings.benchmarks, str):
            settings.benchmarks = [settings.benchmarks]
        settings._check()
        return settings

    def _check(self) -> None:
        from ..tracks import BENCHMARKS

        for entry in self.benchmarks:
            name = entry.partition("=")[0]
            BENCHMARKS.check(name, where="pass_at_k: ")
            if BENCHMARKS[name].kind != "math":
                raise ValueError(
                    f"pass_at_k: {name!r} is a {BENCHMARKS[name].kind} benchmark; held-out Pass@k "
                    "during training grades math answers only (evaluate it with riskpo-eval)."
                )
        for setting in ("num_samples", "eval_steps", "batch_size", "max_problems", "max_new_tokens"):
            value = getattr(self, setting)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"pass_at_k: {setting}={value!r} must be a positive integer.")
        for setting, low, high in (("temperature", 0.0, None), ("top_p", 0.0, 1.0)):
            value = getattr(self, setting)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or value < low
                or (high is not None and value > high)
            ):
                raise ValueError(f"pass_at_k: {setting}={value!r} must be a number in [{low}, {high or 'inf'}].")
        if self.ks is not None and (
            not isinstance(self.ks, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in self.ks)
        ):
            raise ValueError(f"pass_at_k: ks={self.ks!r} must be a list of integers, e.g. [1, 8].")
        self.ks = sorted(set(self.ks)) if self.ks else default_ks(self.num_samples)
        if max(self.ks) > self.num_samples or min(self.ks) < 1:
            raise ValueError(
                f"pass_at_k: ks={self.ks} must lie in [1, num_samples={self.num_samples}]; raise "
                "num_samples or drop k."
            )
