"""What every trainer of this package gets, RiskPO's and the GRPO/GMPO baselines' alike: one layer on a TRL trainer.

:class:`SharedTrainerMixin` goes in front of a TRL GRPO-family trainer (``GRPOTrainer``, ``GMPOTrainer``);
``RiskPOTrainer`` is built on it, and the registry of trainers (``riskpo_trl.trainer.registry``) builds each baseline
as it, so a fix added here reaches every trainer a recipe can name. At construction: the start-up checks, the CPU vLLM
server's weight sync, an adapter's absolute base-model path, the resumed schedule and the VLM image token; per batch:
the reward accounting and the per-batch seam (``add_batch_observer``); at the end: a run without a single step raises,
and the model card is this package's. verl's token mean (``token_mean``) is RiskPOTrainer's alone: only its config has
``loss_token_mean_sequences``.
"""

from __future__ import annotations

from typing import Any

from .. import compat
from ..weight_sync.client import serve_weights_to_cpu_servers
from ..weight_sync.probe import check_weight_syncs
from .batch_hook import BatchObserversMixin
from .caller_warnings import library_default_warnings_silenced
from .checkpoints import TiedWeightsResumeMixin
from .checks import check_start_up
from .model_card import record_absolute_base_model, save_model_card
from .resumed_schedule import continue_schedule_on_resume
from .unscored_rewards import counting_unscored_rewards, warn_unscored


class SharedTrainerMixin(BatchObserversMixin, TiedWeightsResumeMixin):
    """In front of a TRL GRPO-family trainer: the behaviour every trainer of this package shares (module docstring).

    ``config_class`` builds the default config when ``args`` is None, as TRL does.
    """

    config_class: type

    def __init__(self, model, reward_funcs=None, args=None, **kwargs):
        if args is None:
            args = self.config_class(f"{_model_name(model).split('/')[-1]}-{self._name}")
        check_start_up(type(self), trl_trainer_of(type(self)), model, reward_funcs, args, kwargs)
        # A CPU vLLM server gets this package's weight sync; the libraries' warnings about their own defaults are
        # silenced while the trainer builds and trains (caller_warnings).
        with serve_weights_to_cpu_servers(args), library_default_warnings_silenced():
            super().__init__(model, reward_funcs, args=args, **kwargs)
        check_weight_syncs(self)  # a CPU server's dtype, and the log-prob probe after each of its syncs
        record_absolute_base_model(self.model)  # a saved adapter then loads from any working directory
        continue_schedule_on_resume(self)  # a raised max_steps continues at the new schedule's learning rate
        compat.suppress_image_token(self)  # before TRL 1.16, a VLM could sample its image token

    def train(self, *args, **kwargs):
        """`Trainer.train`, but a run that ends without a single optimizer step raises instead of returning as if it
        had trained (e.g. an ``IterableDataset`` that yields fewer examples than one generation batch)."""
        with library_default_warnings_silenced():
            output = super().train(*args, **kwargs)
        if self.state.global_step == 0:
            prompts = self.args.generation_batch_size // self.num_generations
            raise RuntimeError(
                f"Training ended without a single step: the training data yielded fewer than the {prompts} prompts "
                f"one generation batch takes (generation_batch_size={self.args.generation_batch_size} / "
                f"num_generations={self.num_generations}). Add examples, or lower steps_per_generation, "
                "per_device_train_batch_size or the number of processes."
            )
        return output

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # 1. The reward accounting: TRL scores the batch while each reward function's None and NaN are counted; the
        #    NaN ones and the completions no function scored are then named in a warning.
        with counting_unscored_rewards(self) as unscored:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        compat.check_gathered_rewards(len(rewards_per_func), len(prompts), self.accelerator.num_processes)
        start = self.accelerator.process_index * len(prompts)  # the rewards come back gathered over all processes
        warn_unscored(unscored, rewards_per_func[start : start + len(prompts)], completions)
        # 2. The per-batch hook: the gathered rewards are kept for the batch's advantage step and its observers.
        self._scored_rewards = rewards_per_func
        return rewards_per_func

    def create_model_card(
        self,
        model_name: str | None = None,
        dataset_name: str | list[str] | None = None,
        tags: str | list[str] | None = None,
        dataset_files: list[str] | None = None,
    ) -> None:
        """The card of `riskpo_trl.trainer.model_card`: the run's own name, the base model only when it is a Hub id,
        the Hub datasets given (``dataset_files`` for local ones) and, for RiskPO, the risk settings."""
        save_model_card(self, model_name=model_name, datasets=dataset_name, dataset_files=dataset_files, tags=tags)


def trl_trainer_of(trainer_class: type) -> type:
    """The TRL trainer ``trainer_class`` is built on: the first class of its MRO that TRL defines."""
    return next(cls for cls in trainer_class.__mro__ if cls.__module__.split(".")[0] == "trl")


def _model_name(model: Any) -> str:
    from trl.trainer.utils import get_config_model_id

    return model if isinstance(model, str) else get_config_model_id(model.config)
