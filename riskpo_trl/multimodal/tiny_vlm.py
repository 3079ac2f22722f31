"""A tiny LLaVA-style vision-language model (CLIP vision tower + Qwen2 text model) built locally from configs.

For CPU tests of the VLM path: nothing is downloaded. The processor uses the PIL image processor, so it works without
torchvision (Qwen2-VL's processor also wants a video processor, which needs torchvision; LLaVA's does not).
"""

from __future__ import annotations

import os

import torch
from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

from ..compat.generation import clip_image_processor
from ..tiny_model import TINY_MODEL_MARK, build_char_tokenizer

IMAGE_TOKEN = "<image>"
# The char-level chat format of `tiny_model`, with image parts rendered as the image token.
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: "
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tiny_vlm(
    output_dir: str | os.PathLike | None = None, *, image_size: int = 28, patch_size: int = 14, seed: int = 0
) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """A randomly initialised tiny LLaVA and its processor; saved to ``output_dir`` when given.

    Every image becomes ``(image_size / patch_size) ** 2`` image tokens (4 by default).
    """
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tokenizer.chat_template = VLM_CHAT_TEMPLATE
    image_processor = clip_image_processor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
        chat_template=VLM_CHAT_TEMPLATE,
    )
    config = LlavaConfig(
        text_config=dict(
            model_type="qwen2",
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        ),
        vision_config=dict(
            model_type="clip_vision_model",
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=image_size,
            patch_size=patch_size,
            projection_dim=16,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    setattr(config, TINY_MODEL_MARK, True)  # loading it later says it is a tiny random model
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if output_dir is not None:
        model.save_pretrained(output_dir)
        processor.save_pretrained(output_dir)
    return model, processor
