"""The guard rails of a training job, applied to whichever GRPO-family trainer it builds: ``RiskPOTrainer``, or TRL's
own ``GRPOTrainer`` and ``GMPOTrainer``, whose classes stay unchanged. ``riskpo-train`` builds every trainer with
:func:`build`; a notebook does the same in one call, or applies :func:`prepare` to a trainer it built itself.

- :func:`build`, around the construction: the start-up checks (a misspelled keyword, a model path that does not
  exist, missing dataset columns, a training set smaller than one generation batch, vLLM, ``report_to`` and the Hub
  before the model loads), TRL's vLLM client opened through this package's weight sync while the trainer is built in
  server mode (``riskpo_trl.weight_sync``: the CPU server's gloo transport, bounded requests), and the libraries'
  notices about their own defaults silenced within the construction only. Then :func:`prepare`.
- :func:`prepare`, on a built trainer: the weight sync's checks (the server's dtype and context, the log-prob probe
  after each checked sync), the checkpoint guards (``checkpoint_guards``: a full disk named, tied weights not called
  missing on resume, the optimizer state of a multi-process CPU run loading), the reward accounting
  (``reward_accounting``: a function returning NaN or a wrong-shaped output named), an adapter's absolute base-model
  path, the VLM image token (TRL before 1.16), the resumed schedule (a callback), a run that ends without a step
  raising (a callback), and the run's model card (this trainer object's ``create_model_card``). The methods these
  wrap are wrapped on the trainer object, never its class, and change messages and loading only. Applied once; a
  second call changes nothing.
- :func:`train`: ``trainer.train`` with those notices silenced within the call.

Nothing here changes process-wide state beyond its block: TRL's ``VLLMClient`` attribute and the warning filters are
restored when the construction (or the training) ends. What the CLI adds for a whole process (the console, the run
lock, stopping on a signal) is in ``riskpo_trl.scripts.train``, ``run_lock`` and ``preemption``.
"""

from __future__ import annotations

import sys
from typing import Any

from transformers import TrainerCallback

from ..compat.generation import suppress_image_token
from ..weight_sync.bounded import SyncSettings
from ..weight_sync.client import serve_weights_to_cpu_servers
from ..weight_sync.probe import check_weight_syncs
from .checkpoint_guards import guard_checkpoints
from .checks import check_start_up
from .library_warnings import library_default_warnings_silenced
from .model_card import record_absolute_base_model, save_model_card
from .resumed_schedule import continue_schedule_on_resume
from .reward_accounting import account_rewards

PREPARED_ATTRIBUTE = "_riskpo_job_prepared"  # on a trainer: prepare() has run


def build(
    trainer_class: type,
    model: Any,
    reward_funcs: Any = None,
    args: Any = None,
    *,
    weight_sync: SyncSettings | None = None,
    **kwargs: Any,
) -> Any:
    """``trainer_class(model, reward_funcs, args=args, **kwargs)`` with the job's guard rails (module docstring);
    ``args=None`` builds the trainer's default config, as TRL does. ``weight_sync``: the vLLM server's timeouts and
    check period in server mode (default: `SyncSettings`'s)."""
    if args is None:
        args = default_config(trainer_class, model)
    check_start_up(trainer_class, trl_trainer_of(trainer_class), model, reward_funcs, args, kwargs)
    with serve_weights_to_cpu_servers(args, weight_sync), library_default_warnings_silenced():
        trainer = trainer_class(model, reward_funcs, args=args, **kwargs)
    return prepare(trainer)


def prepare(trainer: Any) -> Any:
    """Apply the guard rails that need a built trainer (module docstring) to ``trainer``, once; returns it."""
    if getattr(trainer, PREPARED_ATTRIBUTE, False):
        return trainer
    setattr(trainer, PREPARED_ATTRIBUTE, True)
    check_weight_syncs(trainer)  # a CPU server's dtype, and the log-prob probe after each of its syncs
    guard_checkpoints(trainer)  # a full disk named, tied weights not called missing, a multi-process CPU resume
    account_rewards(trainer)  # a reward function's NaN named as NaN, a wrong-shaped output named
    record_absolute_base_model(trainer.model)  # a saved adapter then loads from any working directory
    suppress_image_token(trainer)  # before TRL 1.16, a VLM could sample its image token
    continue_schedule_on_resume(trainer)  # a raised max_steps continues at the new schedule's learning rate
    if not any(isinstance(callback, RequireAStep) for callback in trainer.callback_handler.callbacks):
        trainer.add_callback(RequireAStep())
    trainer.create_model_card = run_card_writer(trainer)  # checkpoints, push_to_hub and the end write the run's card
    return trainer


def train(trainer: Any, **kwargs: Any) -> Any:
    """``trainer.train(**kwargs)`` with the libraries' notices about their own defaults silenced within the call."""
    with library_default_warnings_silenced():
        return trainer.train(**kwargs)


class RequireAStep(TrainerCallback):
    """A run that ends without a single optimizer step raises instead of returning as if it had trained (e.g. an
    ``IterableDataset`` that yields fewer examples than one generation batch)."""

    def on_train_end(self, args, state, control, **kwargs):
        if state.global_step == 0:
            prompts = args.generation_batch_size // args.num_generations
            raise RuntimeError(
                f"Training ended without a single step: the training data yielded fewer than the {prompts} prompts "
                f"one generation batch takes (generation_batch_size={args.generation_batch_size} / "
                f"num_generations={args.num_generations}). Add examples, or lower steps_per_generation, "
                "per_device_train_batch_size or the number of processes."
            )


def run_card_writer(trainer: Any):
    """``create_model_card(model_name=None, dataset_name=None, tags=None, dataset_files=None)`` for ``trainer``: the
    card of :mod:`riskpo_trl.job.model_card` (the run's own name, the base model only when it is a Hub id, the Hub
    datasets given, ``dataset_files`` for local ones and, for RiskPO, the risk settings)."""

    def create_model_card(model_name=None, dataset_name=None, tags=None, dataset_files=None) -> None:
        save_model_card(trainer, model_name=model_name, datasets=dataset_name, dataset_files=dataset_files, tags=tags)

    return create_model_card


def trl_trainer_of(trainer_class: type) -> type:
    """The TRL trainer ``trainer_class`` is built on: the first class of its MRO that TRL defines."""
    return next(cls for cls in trainer_class.__mro__ if cls.__module__.split(".")[0] == "trl")


def default_config(trainer_class: type, model: Any) -> Any:
    """The config a TRL GRPO-family trainer builds when given none: its config class (``config_class``, or the
    ``<Name>Config`` of its TRL module), with output directory ``<model>-<Name>``."""
    from trl.trainer.utils import get_config_model_id

    base = trl_trainer_of(trainer_class)
    config_class = getattr(trainer_class, "config_class", None)
    if config_class is None:
        config_class = getattr(sys.modules[base.__module__], f"{base.__name__.removesuffix('Trainer')}Config")
    name = config_class.__name__.removesuffix("Config")
    model_name = model if isinstance(model, str) else get_config_model_id(model.config)
    return config_class(f"{model_name.split('/')[-1]}-{name}")
