"""Pass@k learning curves: a callback that evaluates the trainer's current policy every few steps."""

from __future__ import annotations

from typing import Any

from datasets import Dataset
from transformers import TrainerCallback

from ..compat.generation import unwrap_for_generation
from ..rewards.grading import verify_answer
from .benchmarks import render_prompt
from .config import TrainingPassAtK
from .generation import TransformersBackend
from .metrics import benchmark_metrics, default_ks
from .sampling import SamplingSettings
from .scorers import Scorer, score_samples


class PassAtKCallback(TrainerCallback):
    """Every ``eval_steps`` optimizer steps, sample ``num_samples`` completions per held-out problem with the
    trainer's current model and log ``eval/pass@{k}`` for each ``k`` and ``eval/avg@{n}``.

    The values go into ``trainer.state.log_history`` (so ``trainer_state.json`` and ``riskpo-plot`` see them) and to
    the trainer's reporters (W&B, TensorBoard, ...). Sampling uses ``model.generate`` on the training model, whatever
    generation backend the trainer uses, so keep the held-out set small. The problems are split over processes.

    Args:
        trainer: the `RiskPOTrainer` / `GRPOTrainer` (or any `transformers.Trainer`) to evaluate.
        eval_dataset: rows with ``prompt`` (conversational or text) or ``problem``, and the gold answer in
            ``answer_column``.
        num_samples: completions per problem (n).
        ks: the k's of Pass@k (default 1, 2, 4, ..., n).
        eval_steps: evaluate when ``global_step`` is a multiple of it; also at the start if ``eval_on_start``.
        scorer: ``scorer(completion, gold) -> float | None``; math-verify by default.
    """

    def __init__(
        self,
        trainer,
        eval_dataset: Dataset,
        *,
        num_samples: int = 8,
        ks: list[int] | None = None,
        eval_steps: int = 50,
        max_new_tokens: int = 1024,
        temperature: float = 0.8,
        top_p: float = 1.0,
        batch_size: int = 8,
        answer_column: str | None = None,
        scorer: Scorer | None = None,
        eval_on_start: bool = True,
        prefix: str = "eval/",
    ):
        if eval_steps < 1:
            raise ValueError(f"eval_steps={eval_steps} must be >= 1.")
        self.ks = sorted(set(ks)) if ks else default_ks(num_samples)
        if max(self.ks) > num_samples or min(self.ks) < 1:
            raise ValueError(f"ks={self.ks} must lie in [1, num_samples={num_samples}]; raise num_samples or drop k.")
        self.answer_column = answer_column or next(
            (column for column in ("answer", "solution") if column in eval_dataset.column_names), None
        )
        if self.answer_column is None or self.answer_column not in eval_dataset.column_names:
            raise ValueError(
                f"eval_dataset has columns {eval_dataset.column_names}; it needs the gold answer in 'answer' or "
                "'solution', or name the column with answer_column=..."
            )
        if len(eval_dataset) == 0:
            raise ValueError("eval_dataset is empty.")
        self.trainer = trainer
        self.eval_dataset = eval_dataset
        self.settings = SamplingSettings(
            num_samples=num_samples, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens
        )
        self.eval_steps = eval_steps
        self.batch_size = batch_size
        self.scorer = scorer or verify_answer
        self.eval_on_start = eval_on_start
        self.prefix = prefix
        self._last_step: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.eval_on_start:
            self._evaluate_and_log(state)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0:
            self._evaluate_and_log(state)

    def on_train_end(self, args, state, control, **kwargs):
        self._evaluate_and_log(state)  # the final policy's point of the curve (skipped if just evaluated)

    def evaluate(self) -> dict[str, float]:
        """Pass@k / Avg@n of the trainer's current model on the held-out set (same result on every process)."""
        trainer = self.trainer
        accelerator = trainer.accelerator
        tokenizer = trainer.processing_class
        indices = list(range(len(self.eval_dataset)))
        scored: list[tuple[int, list[float]]] = []
        # Padding keeps the number of generate calls equal on every process (needed under ZeRO-3).
        with accelerator.split_between_processes(indices, apply_padding=True) as shard:
            with unwrap_for_generation(
                trainer.model_wrapped, accelerator, getattr(trainer.args, "gradient_checkpointing_kwargs", None)
            ) as model:
                backend = TransformersBackend(model, tokenizer, batch_size=self.batch_size)
                rows = [self.eval_dataset[i] for i in shard]
                samples = backend.generate([render_prompt(row, tokenizer) for row in rows], self.settings)
            for index, row, problem_samples in zip(shard, rows, samples):
                scores, _ = score_samples([s.text for s in problem_samples], str(row[self.answer_column]), self.scorer)
                scored.append((index, scores))
        from accelerate.utils import gather_object

        by_index = dict(gather_object(scored)) if accelerator.num_processes > 1 else dict(scored)
        metrics = benchmark_metrics([by_index[i] for i in sorted(by_index)], self.ks)
        return {f"{self.prefix}{key}": value for key, value in metrics.items()}

    def _evaluate_and_log(self, state) -> None:
        if self._last_step == state.global_step:
            return
        self._last_step = state.global_step
        metrics = self.evaluate()
        trainer = self.trainer
        if trainer.accelerator.is_main_process:
            state.log_history.append({**metrics, "step": state.global_step})
        # Forward to the reporters (W&B, TensorBoard, ...) without going through trainer.log, which would also
        # flush the trainer's accumulated training metrics at this step. The handler's on_log clears should_log,
        # which the trainer checks after on_step_end to log this step's training metrics: keep it as it was.
        should_log = trainer.control.should_log
        trainer.control = trainer.callback_handler.on_log(trainer.args, state, trainer.control, dict(metrics))
        trainer.control.should_log = should_log

    @staticmethod
    def curves(log_history: list[dict[str, Any]], prefix: str = "eval/") -> dict[str, list[tuple[int, float]]]:
        """``{metric: [(step, value), ...]}`` of the Pass@k entries in a ``log_history``."""
        curves: dict[str, list[tuple[int, float]]] = {}
        for entry in log_history:
            for key, value in entry.items():
                if key.startswith(prefix) and ("pass@" in key or "avg@" in key):
                    curves.setdefault(key[len(prefix) :], []).append((entry["step"], value))
        return curves


def add_pass_at_k_callback(trainer, settings: TrainingPassAtK, prompt_template: str | None = None) -> PassAtKCallback:
    """Load the held-out benchmarks ``settings`` names (a recipe's ``pass_at_k:`` block), prompted like the training
    set, and add a :class:`PassAtKCallback` on them to ``trainer``; completions are at most the trainer's
    ``max_completion_length`` unless ``settings.max_new_tokens`` says otherwise."""
    from datasets import concatenate_datasets

    from ..tracks import load_benchmark

    template = {} if prompt_template is None else {"prompt_template": prompt_template}
    parts = []
    for entry in settings.benchmarks:
        name, _, path = entry.partition("=")
        parts.append(load_benchmark(name, data_files=path or None, limit=settings.max_problems, **template))
    callback = PassAtKCallback(
        trainer,
        concatenate_datasets(parts) if len(parts) > 1 else parts[0],
        num_samples=settings.num_samples,
        ks=settings.ks,
        eval_steps=settings.eval_steps,
        max_new_tokens=settings.max_new_tokens or trainer.args.max_completion_length,
        temperature=settings.temperature,
        top_p=settings.top_p,
        batch_size=settings.batch_size,
        eval_on_start=settings.eval_on_start,
    )
    trainer.add_callback(callback)
    return callback
