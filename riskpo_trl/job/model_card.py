"""Model cards that describe the run as it happened: its own name, a base model only when it is on the Hub, the
datasets actually trained on, the reward functions with their weights, and the risk settings, with a quick start
that runs as written (for the model's kind: text, code or vision-language) and the citations of the method and TRL.

TRL's card names the model ``None`` and links ``huggingface.co/None`` for a local run (no hub_model_id, a local base
model) and lists whatever dataset id it is given. Used by `RiskPOTrainer.create_model_card` and by the training
script for every trainer, baselines included. A run that took no training step gets no card.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..risk.baselines import ADVANTAGE_BASELINES
from ..risk.defaults import DEFAULT_ADVANTAGE_BASELINE, resolve_advantage_baseline
from .checks import hub_id_or_none

logger = logging.getLogger(__name__)

# The method's own settings are the fields its config adds to GRPOConfig (none for a GRPO baseline), labelled by the
# words before the first ': ' of their help; these are GRPO's, shown for every trainer.
TRAINING_SETTINGS = (
    ("G (completions per prompt)", "num_generations"),
    ("loss type", "loss_type"),
    ("importance sampling level", "importance_sampling_level"),
    ("clip epsilon", "epsilon"),
    ("KL coefficient", "beta"),
    ("micro-steps per generation batch", "steps_per_generation"),
    ("learning rate", "learning_rate"),
)


# TRL's citation, as TRL's own model cards give it.
TRL_CITATION = """\
@software{vonwerra2020trl,
  title   = {{TRL: Transformers Reinforcement Learning}},
  author  = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and \
Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
  license = {Apache-2.0},
  url     = {https://github.com/huggingface/trl},
  year    = {2020}
}"""

# Said near the top of every card whose run started from `riskpo_trl.tiny_model`'s random model.
TINY_RANDOM_NOTE = (
    "**The base model is a tiny random model**, built by `riskpo_trl.tiny_model` for CPU smoke runs and tests. It "
    "started from random weights and has learned next to nothing: this run checks a pipeline, and its model is not "
    "meant for use."
)

TEXT_QUICK_START = """\
from transformers import pipeline

generator = pipeline("text-generation", model="{model}", device_map="auto")
output = generator([{{"role": "user", "content": "{question}"}}], max_new_tokens=256, return_full_text=False)[0]
print(output["generated_text"])"""
MATH_QUESTION = "What is 7 * 8?"
CODE_QUESTION = "Write a Python function fib(n) that returns the n-th Fibonacci number."
ADAPTER_QUICK_START = """\
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

model = AutoPeftModelForCausalLM.from_pretrained("{model}", device_map="auto")  # the base model, then this adapter
tokenizer = AutoTokenizer.from_pretrained("{model}")
messages = [{{"role": "user", "content": "{question}"}}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                       return_dict=True).to(model.device)
output = model.generate(**inputs, max_new_tokens=256)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))"""
VISION_QUICK_START = """\
from PIL import Image, ImageDraw
from transformers import pipeline

image = Image.new("RGB", (224, 224), "white")  # a drawn triangle; use your own image (a path, URL or PIL image)
ImageDraw.Draw(image).polygon([(30, 190), (194, 190), (112, 40)], outline="black", width=3)
messages = [{{"role": "user", "content": [{{"type": "image", "image": image}},
                                         {{"type": "text", "text": "How many sides does this shape have?"}}]}}]
generator = pipeline("image-text-to-text", model="{model}", device_map="auto")
output = generator(text=messages, max_new_tokens=256, return_full_text=False)[0]
print(output["generated_text"])"""


def card_model_name(args: Any) -> str:
    """The hub id's name if the run pushes somewhere, else the output directory's name."""
    if getattr(args, "hub_model_id", None):
        return args.hub_model_id.split("/")[-1]
    return Path(os.path.abspath(args.output_dir)).name


def method_settings(args: Any) -> list[tuple[str, str]]:
    """``(label, field)`` for each field ``args``'s config class adds to `GRPOConfig`, in declaration order; the label
    is what precedes the first ': ' of the field's help ("Lower quantile level alpha" for ``risk_alpha``)."""
    from trl import GRPOConfig

    if not dataclasses.is_dataclass(args):
        return []
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    return [
        (_first_clause(f.metadata.get("help", "")) or f.name, f.name)
        for f in dataclasses.fields(type(args))
        if f.init and f.name not in grpo_fields
    ]


def _first_clause(text: str) -> str:
    """The help's label: what precedes its first ': ' outside parentheses (every field RiskPOConfig adds has one;
    "Regime guard threshold (the guard is opt-in: see ...)" keeps its aside whole)."""
    depth = 0
    for position, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(": ", position):
            return text[:position]
    return ""


def settings_table(args: Any) -> str:
    """Markdown table of the run's settings next to its config class's defaults (RiskPOConfig's are the paper's,
    except ``advantage_baseline``, whose unset value resolves to :data:`DEFAULT_ADVANTAGE_BASELINE`)."""
    defaults = (
        {f.name: f.default for f in dataclasses.fields(type(args)) if f.default is not dataclasses.MISSING}
        if dataclasses.is_dataclass(args)
        else {}
    )
    if defaults.get("advantage_baseline", "") is None:
        defaults["advantage_baseline"] = DEFAULT_ADVANTAGE_BASELINE
    rows = [f"| setting | value | {type(args).__name__} default |", "| --- | --- | --- |"]
    missing = object()
    for label, name in (*method_settings(args), *TRAINING_SETTINGS):
        value = getattr(args, name, missing)
        if value is not missing and value is not None:  # None: an optional setting left unset
            default = defaults.get(name)
            default = f"`{default}`" if default is not None else "derived" if name in defaults else ""
            rows.append(f"| {label} | `{name}={value}` | {default} |")
    return "\n".join(rows)


def baseline_clause(args: Any) -> str:
    """``", with a leave-one-out baseline (`advantage_baseline="loo"`), which is not the paper's estimator"`` when the
    run's advantage baseline is not the paper's; empty for the paper's and for a config without one (GRPO)."""
    if not hasattr(args, "advantage_baseline"):
        return ""  # a config without one (GRPO)
    baseline = resolve_advantage_baseline(args.advantage_baseline, args.advantage_scaling)
    if baseline == "none":
        return ""
    words = ADVANTAGE_BASELINES.about(baseline)["card"]  # every entry says it (the registry's spec)
    return f', with {words} (`advantage_baseline="{baseline}"`), which is not the paper\'s estimator'


def rewards_table(trainer: Any) -> str:
    """Markdown table of the reward functions the trainer sums, with their weights (empty without any)."""
    names = list(getattr(trainer, "reward_func_names", None) or ())
    weights = getattr(trainer, "reward_weights", None)
    if not names:
        return ""
    weights = [float(w) for w in weights] if weights is not None else [1.0] * len(names)
    rows = ["| reward function | weight |", "| --- | --- |"]
    rows += [f"| `{name}` | {weight:g} |" for name, weight in zip(names, weights)]
    return "The reward of a completion is the weighted sum of:\n\n" + "\n".join(rows)


def quick_start(trainer: Any, model: str) -> str:
    """A snippet that loads ``model`` and asks it something fit for its kind: an image and a question for a
    vision-language model, a programming task for a model trained with a code reward, else an arithmetic question;
    a text model's PEFT adapter loads through PEFT, on the base model its adapter_config.json names."""
    if getattr(trainer, "_is_vlm", False):
        return VISION_QUICK_START.format(model=model)
    names = getattr(trainer, "reward_func_names", None) or ()
    question = CODE_QUESTION if any("code" in name for name in names) else MATH_QUESTION + trained_instruction(trainer)
    template = ADAPTER_QUICK_START if adapter_config(trainer.model) is not None else TEXT_QUICK_START
    return template.format(model=model, question=question.encode("unicode_escape").decode())


def trained_instruction(trainer: Any) -> str:
    """The instruction the training prompts end with (one of the prompt templates', with its separator), so the quick
    start asks in the format the model was trained on; "" when they end with none of them."""
    from ..data.prompts import TEMPLATE_INSTRUCTIONS

    dataset = getattr(trainer, "train_dataset", None)
    prompt = (
        dataset[0].get("prompt") if dataset is not None and len(dataset) and hasattr(dataset, "column_names") else None
    )
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1].get("content"), str):
        return ""
    content = prompt[-1]["content"]
    for instruction in TEMPLATE_INSTRUCTIONS:
        start = len(content) - len(instruction)
        if content.endswith(instruction) and start > 0 and content[start - 1].isspace():
            return content[start - 1 :]
    return ""


def adapter_config(model: Any) -> Any:
    """The PEFT config of the adapter ``model`` trains (a PeftModel's active adapter), or None for a full model."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None
    return configs.get(getattr(model, "active_adapter", None), next(iter(configs.values())))


def record_absolute_base_model(model: Any) -> None:
    """Make a PEFT adapter's ``base_model_name_or_path`` (written to adapter_config.json) absolute when it is a local
    directory, so the saved adapter loads from any working directory; a Hub id stays as it is."""
    config = adapter_config(model)
    name = getattr(config, "base_model_name_or_path", None)
    if name and os.path.isdir(os.path.expanduser(name)):
        config.base_model_name_or_path = os.path.abspath(os.path.expanduser(name))


def base_model_name(model: Any) -> str | None:
    """What the model was fine-tuned from: an adapter's base model as its adapter_config.json records it, else the
    loaded model's name or path."""
    config = adapter_config(model)
    if config is not None and getattr(config, "base_model_name_or_path", None):
        return config.base_model_name_or_path
    return getattr(getattr(model, "config", None), "name_or_path", None)


def build_model_card(
    trainer: Any,
    *,
    model_name: str | None = None,
    datasets: str | Sequence[str] | None = None,
    dataset_files: Sequence[str] | None = None,
    tags: str | Sequence[str] | None = None,
) -> ModelCard:
    """The card of ``trainer``'s run. ``datasets`` are Hub dataset ids (only those that were really loaded from the
    Hub); ``dataset_files`` are local files the run read instead, named in the text only."""
    args = trainer.args
    model_name = model_name or card_model_name(args)
    base_name = base_model_name(trainer.model)
    base_model = hub_id_or_none(base_name)
    adapter = adapter_config(trainer.model)
    hub_datasets = [datasets] if isinstance(datasets, str) else [name for name in datasets or () if name]
    hub_datasets = [name for name in hub_datasets if hub_id_or_none(name)]
    local_files = [Path(path).name for path in dataset_files or ()]
    trainer_name = getattr(trainer, "_name", type(trainer).__name__)
    paper = getattr(trainer, "_paper", None) or {}
    tag_set = {tags} if isinstance(tags, str) else set(tags or ())
    tag_set.update(getattr(trainer, "_tag_names", ()))
    if adapter is not None:
        peft_type = getattr(adapter, "peft_type", None)
        tag_set.update({"peft", *([str(getattr(peft_type, "value", peft_type)).lower()] if peft_type else [])})
        if base_model:
            tag_set.add(f"base_model:adapter:{base_model}")

    card_data = ModelCardData(
        base_model=base_model,
        datasets=hub_datasets or None,
        library_name="peft" if adapter is not None else "transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *sorted(tag_set)],
    )
    # Without a Hub repository the model is where the card is: its absolute path loads from any directory.
    usage_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id or os.path.abspath(args.output_dir)
    sections = [f"# Model Card for {model_name}", _provenance(base_model, hub_datasets, local_files)]
    if _is_tiny_random(trainer.model, base_name):
        sections.append(TINY_RANDOM_NOTE)
    if adapter is not None:
        sections.append(_adapter_note(adapter, base_model, base_name))
    sections.append(f"## Quick start\n\n```python\n{quick_start(trainer, usage_id)}\n```")
    method = f"This model was trained with {trainer_name}"
    if paper.get("id"):
        method += f", a method introduced in [{paper['title']}](https://huggingface.co/papers/{paper['id']})"
    method += baseline_clause(args)
    steps = getattr(getattr(trainer, "state", None), "global_step", None)
    method += f", for {steps} optimizer steps." if steps else "."
    procedure = [method, rewards_table(trainer), settings_table(args)]
    sections.append("## Training procedure\n\n" + "\n\n".join(part for part in procedure if part))
    packages = ("trl", "transformers", "torch", "datasets", "tokenizers")
    sections.append("### Framework versions\n\n" + "\n".join(f"- {name}: {version(name)}" for name in packages))
    citations = ["## Citations"]
    if paper.get("citation"):
        citations.append(f"Cite {trainer_name} as:\n\n```bibtex\n{paper['citation']}\n```")
    citations.append(f"Cite TRL as:\n\n```bibtex\n{TRL_CITATION}\n```")
    sections.append("\n\n".join(citations))
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def _is_tiny_random(model: Any, base_name: str | None) -> bool:
    """Whether the run started from this package's tiny random model: the loaded model's config carries its mark, or,
    for an adapter, the base model's directory does."""
    from ..tiny_model import is_tiny_random_model

    return is_tiny_random_model(model) or bool(
        base_name and os.path.isdir(base_name) and is_tiny_random_model(base_name)
    )


def save_model_card(trainer: Any, **card_fields) -> str | None:
    """Write the card as ``output_dir/README.md`` on the main process; returns its path there, None elsewhere. A run
    that has taken no training step gets no card (a card says how the model was trained), only a warning."""
    if not trainer.is_world_process_zero():
        return None
    if not trainer.state.global_step:
        logger.warning("No model card written: the run has taken no training step, so there is nothing to describe.")
        return None
    path = os.path.join(trainer.args.output_dir, "README.md")
    build_model_card(trainer, **card_fields).save(path)
    return path


def _adapter_note(adapter: Any, base_model: str | None, base_name: str | None) -> str:
    """What an adapter directory is and what loading it needs."""
    kind = str(getattr(getattr(adapter, "peft_type", None), "value", "PEFT"))
    kind = {"LORA": "LoRA"}.get(kind, kind)
    text = (
        f"This repository holds a {kind} adapter (PEFT), not a full model: loading it loads its base model, as "
        "`base_model_name_or_path` in `adapter_config.json` names it, and applies the adapter on top."
    )
    if base_model:
        return text + f" The base model is [{base_model}](https://huggingface.co/{base_model}) on the Hub."
    return text + (
        f" The base model is the local directory `{base_name}`, not a Hub model: the quick start runs where that "
        "directory exists. Elsewhere, copy the base model along and set `base_model_name_or_path` in "
        "`adapter_config.json` to its new path (or load it yourself and apply the adapter with "
        "`PeftModel.from_pretrained(base_model, adapter_directory)`)."
    )


def _provenance(base_model: str | None, hub_datasets: list[str], local_files: list[str]) -> str:
    text = (
        f"This model is a fine-tuned version of [{base_model}](https://huggingface.co/{base_model})"
        if base_model
        else "This model was fine-tuned from a local checkpoint"
    )
    sources = [f"[{name}](https://huggingface.co/datasets/{name})" for name in hub_datasets]
    sources += [f"`{name}`" for name in local_files]
    if sources:
        text += f", trained on {', '.join(sources)}"
    return text + ". It has been trained using [TRL](https://github.com/huggingface/trl)."
