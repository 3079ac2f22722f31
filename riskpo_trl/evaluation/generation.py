"""Sampling backends for evaluation: vLLM offline when installed, transformers ``generate`` otherwise.

Both take chat-formatted prompt strings (plus, for a vision-language model, each prompt's images) and return, per
prompt, ``n`` :class:`Sample` objects with the same fields, so everything downstream (scoring, metrics, files) is
backend-agnostic.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from .sampling import Sample, SamplingSettings

# Per prompt, the images it shows (vision-language models); None for text-only prompts.
PromptImages = Sequence[Sequence[Any]] | None


VLLM_MISSING = (
    "backend='vllm' needs vLLM, which is not installed. Install it with `pip install riskpo-trl[vllm]` on a GPU "
    "machine, or use backend='transformers'."
)


def is_vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


class TransformersBackend:
    """Samples with ``model.generate``; fits CPU runs and small models, and the live model inside a trainer.

    ``processor``: a vision-language model's processor, which turns prompts with images into model inputs.
    """

    def __init__(self, model, tokenizer, batch_size: int = 8, processor=None):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.processor = processor

    @classmethod
    def from_pretrained(cls, model_name_or_path: str, adapter: str | None = None, batch_size: int = 8, **model_kwargs):
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoProcessor,
            AutoTokenizer,
        )

        processor = None
        if hasattr(AutoConfig.from_pretrained(model_name_or_path), "vision_config"):  # e.g. the Geometry3K track
            processor = AutoProcessor.from_pretrained(model_name_or_path)
            tokenizer = processor.tokenizer
            model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, **model_kwargs)
        else:
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
            model = AutoModelForCausalLM.from_pretrained(model_name_or_path, **model_kwargs)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
        model.eval()
        return cls(model, tokenizer, batch_size=batch_size, processor=processor)

    @torch.no_grad()
    def generate(
        self, prompts: list[str], settings: SamplingSettings, images: PromptImages = None
    ) -> list[list[Sample]]:
        if images is not None and self.processor is None:
            raise ValueError(
                "These prompts come with images, but the model was loaded without an image processor; "
                "evaluate a vision-language model (its config has a vision_config)."
            )
        was_training = self.model.training
        self.model.eval()
        try:
            results: list[list[Sample]] = []
            for start in range(0, len(prompts), self.batch_size):
                batch_images = None if images is None else images[start : start + self.batch_size]
                results.extend(self._generate_batch(prompts[start : start + self.batch_size], settings, batch_images))
            return results
        finally:
            self.model.train(was_training)

    def _model_inputs(self, prompts: list[str], images: PromptImages) -> dict[str, torch.Tensor]:
        tokenizer = self.tokenizer
        padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"  # decoder-only: pad on the left
        try:
            # The chat template already wrote any special tokens the model expects.
            if images is None:
                return dict(tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False))
            flat_images = [image for prompt_images in images for image in prompt_images]
            return dict(
                self.processor(
                    text=prompts, images=flat_images, return_tensors="pt", padding=True, add_special_tokens=False
                )
            )
        finally:
            tokenizer.padding_side = padding_side

    def _generate_batch(
        self, prompts: list[str], settings: SamplingSettings, images: PromptImages = None
    ) -> list[list[Sample]]:
        tokenizer = self.tokenizer
        inputs = self._model_inputs(prompts, images)
        device = next(self.model.parameters()).device
        inputs = {key: value.to(device) for key, value in inputs.items()}
        do_sample = settings.temperature > 0
        sampling = {"temperature": settings.temperature, "top_p": settings.top_p} if do_sample else {}
        sequences = self.model.generate(
            **inputs,
            do_sample=do_sample,
            num_return_sequences=settings.num_samples,
            max_new_tokens=settings.max_new_tokens,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            **sampling,
        )
        prompt_length = inputs["input_ids"].shape[1]
        completion_ids = sequences[:, prompt_length:]
        stop_ids = self._stop_token_ids()
        completion_mask = _completion_mask(completion_ids, stop_ids, tokenizer.pad_token_id)
        mean_logprobs = None
        if settings.return_logprobs:
            if images is not None:
                raise ValueError("return_logprobs is only supported for text-only prompts.")
            mean_logprobs = self._mean_logprobs(
                sequences, inputs["attention_mask"], completion_mask, settings.num_samples
            )
        # The text stops before the stop token, as vLLM's does: a stop id that is no special token (a generation
        # config may list any) would otherwise end the text here and not there. The token still counts in lengths.
        kept = [
            [token for token, keep in zip(ids, mask) if keep and token not in stop_ids]
            for ids, mask in zip(completion_ids.tolist(), completion_mask.tolist())
        ]
        texts = tokenizer.batch_decode(kept, skip_special_tokens=True)
        lengths = completion_mask.sum(dim=1).tolist()
        samples = [
            Sample(text, int(length), None if mean_logprobs is None else mean_logprobs[i])
            for i, (text, length) in enumerate(zip(texts, lengths))
        ]
        n = settings.num_samples
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _stop_token_ids(self) -> list[int]:
        """Every id ``generate`` stops on: the generation config's EOS (often a list, e.g. Qwen's <|im_end|> and
        <|endoftext|>) plus the tokenizer's, so a completion ending on any of them is measured without its padding."""
        generation_config = getattr(self.model, "generation_config", None)
        return _as_id_list(getattr(generation_config, "eos_token_id", None)) + _as_id_list(self.tokenizer.eos_token_id)

    def _mean_logprobs(self, sequences, prompt_mask, completion_mask, num_samples: int) -> list[float]:
        """Mean log-probability per completion token under the model itself (temperature 1, no top-p)."""
        attention_mask = torch.cat([prompt_mask.repeat_interleave(num_samples, dim=0), completion_mask], dim=1)
        logits = self.model(input_ids=sequences, attention_mask=attention_mask).logits
        prompt_length = prompt_mask.shape[1]
        # Logits at position t predict token t + 1.
        completion_logits = logits[:, prompt_length - 1 : -1].float()
        token_logprobs = (
            torch.log_softmax(completion_logits, dim=-1)
            .gather(-1, sequences[:, prompt_length:].unsqueeze(-1))
            .squeeze(-1)
        )
        mask = completion_mask.float()
        return ((token_logprobs * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).tolist()


def _as_id_list(token_ids: int | list[int] | None) -> list[int]:
    if token_ids is None:
        return []
    return [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in token_ids]


def _completion_mask(
    completion_ids: torch.Tensor, stop_token_ids: int | list[int] | None, pad_token_id: int | None = None
) -> torch.Tensor:
    """1 for tokens up to and including the first stop token, 0 after it (generate pads finished sequences).

    Trailing pad tokens that are not a stop token also count 0: a sequence that ended on a stop id we were not told
    about is still measured without its padding.
    """
    is_stop = torch.zeros_like(completion_ids, dtype=torch.bool)
    for stop in set(_as_id_list(stop_token_ids)):
        is_stop |= completion_ids == stop
    # Count stop tokens seen strictly before each position: a token is kept while none has been seen.
    stop_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    mask = stop_before == 0
    if pad_token_id is not None:
        is_pad = completion_ids == pad_token_id
        # Positions from which every token to the end is padding: reverse cumulative product of is_pad.
        trailing_pad = torch.cumprod(is_pad.flip(1).long(), dim=1).flip(1).bool()
        mask &= ~(trailing_pad & ~is_stop)
    return mask.long()


class VLLMBackend:
    """Samples with vLLM's offline engine (``vllm.LLM``); imported only when this backend is chosen.

    The engine is seeded once, here. Requests carry no seed of their own: one fixed per-request seed would give every
    problem the same random stream, correlating their samples.
    """

    def __init__(self, model_name_or_path: str, adapter: str | None = None, seed: int = 0, **llm_kwargs):
        if not is_vllm_available():
            raise ImportError(VLLM_MISSING)
        from vllm import LLM

        self.adapter = adapter
        if adapter is not None:
            llm_kwargs.setdefault("enable_lora", True)
        self.llm = LLM(model=model_name_or_path, seed=seed, **llm_kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def generate(
        self, prompts: list[str], settings: SamplingSettings, images: PromptImages = None
    ) -> list[list[Sample]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=settings.num_samples,
            temperature=settings.temperature,
            top_p=settings.top_p,
            max_tokens=settings.max_new_tokens,
            logprobs=0 if settings.return_logprobs else None,  # 0: the sampled token's log-prob only
        )
        lora_request = None
        if self.adapter is not None:
            from vllm.lora.request import LoRARequest

            lora_request = LoRARequest("adapter", 1, self.adapter)
        requests: list = list(prompts)
        if images is not None:  # vLLM's multi-modal prompt form
            requests = [
                {"prompt": prompt, "multi_modal_data": {"image": list(prompt_images)}}
                for prompt, prompt_images in zip(prompts, images)
            ]
        outputs = self.llm.generate(requests, params, lora_request=lora_request, use_tqdm=False)
        results = []
        for output in outputs:
            samples = []
            for completion in output.outputs:
                num_tokens = len(completion.token_ids)
                mean_logprob = None
                if settings.return_logprobs and num_tokens:
                    mean_logprob = completion.cumulative_logprob / num_tokens
                samples.append(Sample(completion.text, num_tokens, mean_logprob))
            results.append(samples)
        return results


def load_backend(
    backend: str,
    model_name_or_path: str,
    adapter: str | None = None,
    batch_size: int = 8,
    dtype: str = "auto",
    seed: int = 0,
    vllm_kwargs: dict[str, Any] | None = None,
):
    """Build the sampling backend: ``"vllm"``, ``"transformers"``, or ``"auto"`` (vLLM if installed and a GPU is
    visible, transformers otherwise); ``vllm_kwargs`` go to ``vllm.LLM``. A model that fails to load raises a
    RuntimeError naming it."""
    if backend not in ("auto", "vllm", "transformers"):
        raise ValueError(f"backend={backend!r} is unknown; choose 'auto', 'vllm' or 'transformers'.")
    if backend == "auto":
        backend = "vllm" if is_vllm_available() and torch.cuda.is_available() else "transformers"
    if backend == "vllm" and not is_vllm_available():
        raise ImportError(VLLM_MISSING)
    try:
        if backend == "vllm":
            return VLLMBackend(model_name_or_path, adapter, seed=seed, dtype=dtype, **(vllm_kwargs or {}))
        return TransformersBackend.from_pretrained(model_name_or_path, adapter, batch_size=batch_size, dtype=dtype)
    except Exception as error:
        raise RuntimeError(
            f"Could not load model {model_name_or_path!r}"
            + (f" with adapter {adapter!r}" if adapter else "")
            + f" for the {backend} backend: {error}. Check the path or Hub id (and HF_TOKEN for gated models)."
        ) from error
