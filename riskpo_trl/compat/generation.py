"""Code around generation that differs between the supported TRL and transformers releases.

- TRL < 1.16: `unwrap_model_for_generation` takes no ``gradient_checkpointing_kwargs`` and re-enables gradient
  checkpointing with the defaults; `unwrap_for_generation` re-enables it with the run's kwargs.
- TRL < 1.16: generation without vLLM may sample a vision-language model's image token, which then mismatches the
  image features; `suppress_image_token` keeps it out, as TRL 1.16 does.
- transformers 4.x has no `CLIPImageProcessorPil`; its `CLIPImageProcessor` is the PIL one (`clip_image_processor`).
- transformers 4.x: TRL refuses tools and ``environment_factory`` (`TOOLS_NEED_TRANSFORMERS`,
  `ENVIRONMENTS_NEED_TRANSFORMERS`, `transformers_at_least`), with its own error when the trainer is built.
- TRL 1.13 has no `is_async_callable` and awaits coroutine functions only; `trl_awaits` answers as the installed
  release decides (the job layer's reward accounting wraps an async reward function so that TRL still awaits it).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from packaging.version import Version

from . import installed_version

# TRL (1.13 to 1.16) refuses, when the trainer is built, tools before transformers 5.0.0 and environment_factory
# before 5.2.0 (within the pins: 5.5.4).
TOOLS_NEED_TRANSFORMERS = "5.0.0"
ENVIRONMENTS_NEED_TRANSFORMERS = "5.2.0"


@contextlib.contextmanager
def unwrap_for_generation(model: Any, accelerator: Any, gradient_checkpointing_kwargs: dict | None) -> Iterator[Any]:
    """TRL's `unwrap_model_for_generation`, after which gradient checkpointing is back on with the run's kwargs in
    every supported release (before 1.16 TRL takes no such keyword and turns it back on with the defaults)."""
    from trl.models.utils import unwrap_model_for_generation

    if "gradient_checkpointing_kwargs" in inspect.signature(unwrap_model_for_generation).parameters:
        with unwrap_model_for_generation(
            model, accelerator, gradient_checkpointing_kwargs=gradient_checkpointing_kwargs
        ) as unwrapped:
            yield unwrapped
        return
    with unwrap_model_for_generation(model, accelerator) as unwrapped:
        yield unwrapped
    if gradient_checkpointing_kwargs and getattr(unwrapped, "is_gradient_checkpointing", False):
        unwrapped.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)


def suppress_image_token(trainer: Any) -> None:
    """Keep generation without vLLM from sampling a vision-language model's image token (a sampled one mismatches the
    image features). TRL 1.16 does this itself, and then this changes nothing; a ``suppress_tokens`` in the config's
    ``generation_kwargs`` wins, as in TRL."""
    from transformers import GenerationConfig, ProcessorMixin

    settings = getattr(trainer, "generation_kwargs", None)  # set by GRPOTrainer when it generates without vLLM
    image_token_id = getattr(trainer.model.config, "image_token_id", None)
    if (
        getattr(trainer, "use_vllm", False)
        or not isinstance(trainer.processing_class, ProcessorMixin)
        or not isinstance(settings, dict)
        or image_token_id is None
        or "suppress_tokens" in settings
    ):
        return
    settings["suppress_tokens"] = [image_token_id]
    trainer.generation_config = GenerationConfig(**settings, disable_compile=True)


def clip_image_processor(**kwargs: Any) -> Any:
    """A CLIP image processor that needs no torchvision: `CLIPImageProcessorPil` (transformers 5) or
    `CLIPImageProcessor` (4.x, where it is the PIL one)."""
    try:
        from transformers import CLIPImageProcessorPil as processor_class
    except ImportError:
        from transformers import CLIPImageProcessor as processor_class
    return processor_class(**kwargs)


def transformers_at_least(release: str) -> bool:
    installed = installed_version("transformers")
    return installed is not None and Version(installed) >= Version(release)


def trl_awaits(func: Any) -> bool:
    """Whether GRPOTrainer awaits ``func`` as an async reward function: by TRL's own test, `is_async_callable`, which
    from 1.14 also takes an object whose ``__call__`` is a coroutine function; 1.13 awaits coroutine functions only."""
    try:
        from trl.trainer.utils import is_async_callable
    except ImportError:
        return inspect.iscoroutinefunction(func)
    return is_async_callable(func)
