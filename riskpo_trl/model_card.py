"""Model cards that describe the run as it happened: its own name, a base model only when it is on the Hub, the
datasets actually trained on, and the risk settings.

TRL's card names the model ``None`` and links ``huggingface.co/None`` for a local run (no hub_model_id, a local base
model) and lists whatever dataset id it is given. Used by `RiskPOTrainer.create_model_card` and by the training
script for every trainer, baselines included.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

# (label, config field); rows whose field the config lacks are left out, so a baseline's card has no risk rows and
# opt-ins added to RiskPOConfig show up once listed here.
RISK_SETTINGS = (
    ("risk measure", "risk_profile"),
    ("alpha (lower quantile level)", "risk_alpha"),
    ("beta (upper quantile level)", "risk_beta"),
    ("omega (extra weight of the lower tail)", "risk_omega"),
    ("B (prompts per bundle)", "bundle_size"),
    ("quantile source", "quantile_source"),
    ("quantile tracker step", "quantile_lr"),
    ("quantile tracker step decay", "quantile_lr_decay"),
    ("advantage scaling", "advantage_scaling"),
    ("natural baseline", "natural_baseline"),
    ("credit assignment", "credit_assignment"),
    ("bundling", "bundling"),
)
TRAINING_SETTINGS = (
    ("G (completions per prompt)", "num_generations"),
    ("loss type", "loss_type"),
    ("importance sampling level", "importance_sampling_level"),
    ("clip epsilon", "epsilon"),
    ("KL coefficient", "beta"),
    ("micro-steps per generation batch", "steps_per_generation"),
    ("learning rate", "learning_rate"),
)


def hub_id_or_none(name: str | None) -> str | None:
    """``name`` if it reads as a Hub repository id and is not a local path, else None."""
    if not name or os.path.isabs(name) or name.startswith((".", "~")) or os.path.exists(name):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def card_model_name(args: Any) -> str:
    """The hub id's name if the run pushes somewhere, else the output directory's name."""
    if getattr(args, "hub_model_id", None):
        return args.hub_model_id.split("/")[-1]
    return Path(os.path.abspath(args.output_dir)).name


def settings_table(args: Any) -> str:
    """Markdown table of the run's settings next to its config class's defaults (RiskPOConfig's are the paper's)."""
    defaults = {
        f.name: f.default for f in dataclasses.fields(type(args)) if f.default is not dataclasses.MISSING
    } if dataclasses.is_dataclass(args) else {}
    rows = [f"| setting | value | {type(args).__name__} default |", "| --- | --- | --- |"]
    missing = object()
    for label, name in (*RISK_SETTINGS, *TRAINING_SETTINGS):
        value = getattr(args, name, missing)
        if value is not missing:
            default = defaults.get(name)
            default = f"`{default}`" if default is not None else "derived" if name in defaults else ""
            rows.append(f"| {label} | `{name}={value}` | {default} |")
    return "\n".join(rows)


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
    base_model = hub_id_or_none(getattr(trainer.model.config, "_name_or_path", None))
    hub_datasets = [datasets] if isinstance(datasets, str) else [name for name in datasets or () if name]
    hub_datasets = [name for name in hub_datasets if hub_id_or_none(name)]
    local_files = [Path(path).name for path in dataset_files or ()]
    trainer_name = getattr(trainer, "_name", type(trainer).__name__)
    paper = getattr(trainer, "_paper", None) or {}
    tag_set = {tags} if isinstance(tags, str) else set(tags or ())
    tag_set.update(getattr(trainer, "_tag_names", ()))

    card_data = ModelCardData(
        base_model=base_model,
        datasets=hub_datasets or None,
        library_name="transformers",
        model_name=model_name,
        tags=["generated_from_trainer", *sorted(tag_set)],
    )
    usage_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id or args.output_dir
    sections = [f"# Model Card for {model_name}", _provenance(base_model, hub_datasets, local_files)]
    sections.append(
        "## Quick start\n\n```python\nfrom transformers import pipeline\n\n"
        f'generator = pipeline("text-generation", model="{usage_id}", device_map="auto")\n'
        'output = generator([{"role": "user", "content": "What is 7 * 8?"}], max_new_tokens=256, '
        'return_full_text=False)[0]\nprint(output["generated_text"])\n```'
    )
    method = f"This model was trained with {trainer_name}"
    if paper.get("id"):
        method += f", a method introduced in [{paper['title']}](https://huggingface.co/papers/{paper['id']})"
    sections.append(f"## Training procedure\n\n{method}.\n\n{settings_table(args)}")
    packages = ("trl", "transformers", "torch", "datasets", "tokenizers")
    sections.append("### Framework versions\n\n" + "\n".join(f"- {name}: {version(name)}" for name in packages))
    if paper.get("citation"):
        sections.append(f"## Citation\n\n```bibtex\n{paper['citation']}\n```")
    return ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n\n".join(sections) + "\n")


def save_model_card(trainer: Any, **card_fields) -> str | None:
    """Write the card as ``output_dir/README.md`` on the main process; returns its path there, None elsewhere."""
    if not trainer.is_world_process_zero():
        return None
    path = os.path.join(trainer.args.output_dir, "README.md")
    build_model_card(trainer, **card_fields).save(path)
    return path


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
