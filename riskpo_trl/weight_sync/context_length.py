"""The start-up check that the server's context holds the longest sequence the run can ask for: the longest prompt of
the training data, as the chat template renders it, plus ``max_completion_length``. Without it, a too-short
``--max_model_len`` passes the sync and fails at the first generation with TRL's bare ``Request failed: 400``, or
mid-run when only some prompts are too long."""

from __future__ import annotations

from typing import Any


def longest_prompt_tokens(trainer: Any) -> int | None:
    """Tokens of the longest prompt of ``trainer.train_dataset`` (chat prompts through the chat template, with the
    generation prompt and the config's ``chat_template_kwargs``); None for data that cannot be read ahead (an
    iterable dataset, no ``prompt`` column). Each prompt is tokenized once: seconds for thousands of prompts."""
    dataset = getattr(trainer, "train_dataset", None)
    if dataset is None or not hasattr(dataset, "column_names") or "prompt" not in (dataset.column_names or ()):
        return None
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    template_kwargs = getattr(trainer.args, "chat_template_kwargs", None) or {}
    longest = 0
    for prompt in dataset["prompt"]:
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False, **template_kwargs
            )
        else:
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        longest = max(longest, len(ids))
    return longest


def context_refusal(client: Any, trainer: Any) -> str | None:
    """Why a server whose ``max_model_len`` is shorter than the longest prompt plus ``max_completion_length`` is
    refused, or None (also when either is unknown)."""
    limit = getattr(client, "max_model_len", None)
    completion = getattr(trainer.args, "max_completion_length", None)
    if not limit or not completion:
        return None
    prompt = longest_prompt_tokens(trainer)
    if prompt is None or prompt + completion <= limit:
        return None
    return (
        f"The vLLM server at {client.base_url} takes at most {limit} tokens per sequence (max_model_len), and "
        f"this run needs {prompt + completion}: its longest prompt has {prompt} tokens and max_completion_length "
        f"is {completion}. Restart the server with --max_model_len {prompt + completion} or more, or lower "
        "max_completion_length."
    )
