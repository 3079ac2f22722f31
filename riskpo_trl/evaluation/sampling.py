"""What a sampling backend is asked (:class:`SamplingSettings`) and returns (:class:`Sample`); no heavy imports, so
configs and command lines can name them without loading torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingSettings:
    """How completions are sampled (the paper evaluates at temperature 0.8 in its training setup)."""

    num_samples: int = 8
    temperature: float = 0.8
    top_p: float = 1.0
    max_new_tokens: int = 1024
    seed: int = 0  # the evaluator seeds transformers with it; a vLLM engine gets its seed when it is built
    return_logprobs: bool = False  # length-normalised log-prob of each completion under the model (temperature 1)


@dataclass
class Sample:
    text: str
    num_tokens: int
    mean_logprob: float | None = None  # mean per-token log-probability, when asked for
