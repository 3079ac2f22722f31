"""A tiny Qwen2 causal LM with a character-level tokenizer, built locally from a config.

For CPU smoke runs, tests, notebooks and benchmarks on machines that cannot reach the Hub: nothing is downloaded.
The model is randomly initialised (or trained by you); its tokenizer knows a chat template, so TRL's conversational
prompt handling works as it does for real chat models.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import string
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
DEFAULT_ALPHABET = string.ascii_letters + string.digits + string.punctuation + " \n"

# Plain-text chat format: one line per turn, generation continues after "assistant:".
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

logger = logging.getLogger(__name__)

# A field of config.json that marks a model built here, so that whatever loads it later (riskpo-train, riskpo-eval,
# the trainer) says it is a tiny random model: a directory named like a Hub id must not pass for the real model. It
# stays in the config of a model trained from it.
TINY_MODEL_MARK = "riskpo_trl_tiny_random_model"
_announced: set[str] = set()

# Sizes for vLLM's CPU build: its attention kernel takes head dimensions 32, 64, 80, ... 256 and 512, not the default
# model's 8 (32 hidden / 4 heads). ``build_tiny_model(path, **VLLM_CPU_SIZES)`` gives head_dim 64.
VLLM_CPU_SIZES = {"hidden_size": 128, "num_heads": 2, "num_kv_heads": 2, "intermediate_size": 128}


def _byte_level(text: str) -> list[str]:
    """The byte-level (GPT-2) characters that stand for ``text``'s UTF-8 bytes."""
    table = _bytes_to_unicode()
    return [table[b] for b in text.encode("utf-8")]


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character map, which ByteLevel pre-tokenizers use.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
    printable += list(range(ord("\xae"), ord("\xff") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars)))


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET, vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of ``alphabet`` plus pad/eos/bos/unk and a chat template.

    ``vocab_size`` pads the vocabulary to that many tokens (every byte, then runs of two and more bytes): text still
    encodes one token per character, and a random model with a real model's vocabulary size (e.g. Qwen2.5's 151936)
    decodes whatever it samples."""
    # Byte-level BPE without merges is character-level, and it is also what transformers' Qwen2 tokenizer class
    # rebuilds when AutoTokenizer loads the saved files, so both load paths tokenize identically.
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for char in dict.fromkeys(alphabet):  # keep order, drop repeats
        for mapped in _byte_level(char):
            vocab.setdefault(mapped, len(vocab))
    if vocab_size is not None:
        _pad_vocabulary(vocab, vocab_size)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: generate() refuses them
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _pad_vocabulary(vocab: dict[str, int], size: int) -> None:
    """Add byte-level tokens of one, two, three... bytes until ``vocab`` holds ``size``; no merge ever forms them."""
    if size < len(vocab):
        raise ValueError(f"vocab_size={size} is smaller than the {len(vocab)} tokens the alphabet already needs.")
    byte_chars = list(_bytes_to_unicode().values())
    for length in itertools.count(1):
        for chars in itertools.product(byte_chars, repeat=length):
            if len(vocab) >= size:
                return
            vocab.setdefault("".join(chars), len(vocab))


def build_tiny_model(
    output_dir: str | os.PathLike | None = None,
    *,
    alphabet: str = DEFAULT_ALPHABET,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 512,
    initializer_range: float = 0.02,
    seed: int = 0,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Build a randomly initialised few-layer Qwen2 model and its character tokenizer.

    The config carries ``TINY_MODEL_MARK``: `warn_if_tiny_random_model` names such a model whenever it is loaded.
    If ``output_dir`` is given, both are saved there so ``from_pretrained(output_dir)`` (and every TRL entry point
    that takes a model path) loads them. With the default ``initializer_range`` the logits are nearly flat and greedy
    decoding repeats one token whatever the prompt; around 0.2 the completions depend on the prompt.
    """
    tokenizer = build_char_tokenizer(alphabet)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )
    setattr(config, TINY_MODEL_MARK, True)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if output_dir is not None:
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
    return model, tokenizer


def is_tiny_random_model(model_or_path: Any) -> bool:
    """Whether ``model_or_path`` (a loaded model, or a local directory with a config.json) was built by
    `build_tiny_model` (or `build_tiny_vlm`), or trained from such a model."""
    if isinstance(model_or_path, (str, os.PathLike)):
        config_file = os.path.join(os.path.expanduser(model_or_path), "config.json")
        if not os.path.isfile(config_file):
            return False
        try:
            with open(config_file) as f:
                config = json.load(f)
        except (OSError, ValueError):
            return False
        return bool(config.get(TINY_MODEL_MARK))
    return bool(getattr(getattr(model_or_path, "config", None), TINY_MODEL_MARK, False))


def warn_if_tiny_random_model(model_or_path: Any, what: str = "model", message: str | None = None) -> bool:
    """Log one warning line if ``model_or_path`` is a tiny random model (see `is_tiny_random_model`), once per
    process and model, from the first process only (``message`` in place of the default text); True if it is
    one."""
    if not is_tiny_random_model(model_or_path):
        return False
    if isinstance(model_or_path, (str, os.PathLike)):
        key, name = os.path.abspath(os.path.expanduser(model_or_path)), f"{what} {os.fspath(model_or_path)!r}"
    else:
        key = name = f"{what} {getattr(getattr(model_or_path, 'config', None), 'name_or_path', '') or '(loaded)'}"
    if key not in _announced and os.environ.get("RANK", "0") == "0":
        _announced.add(key)
        logger.warning(
            message
            or f"{name} is a tiny RANDOM model built by riskpo_trl's build_tiny_model or build_tiny_vlm (config.json: "
            f"{TINY_MODEL_MARK}), "
            "for smoke runs and tests, not a pretrained model; for real training or evaluation give a Hub id or a "
            "pretrained model's directory."
        )
    return True
