"""What a run did at each optimizer step, read from the public seams, so that a resumed run can be held against the
uninterrupted one: the GPU check's training, LoRA and DeepSpeed parts all compare runs this way."""

from __future__ import annotations

from typing import Any

# What a resumed step must repeat exactly. The tracker and bundles exist for RiskPO only.
RECORDED = ("tracker", "bundle_ids", "completion_ids", "advantages")


class StepRecorder:
    """Records, per optimizer step, the training batch's completions and advantages and, for RiskPO, its bundles and
    the quantile tracker; also the tracker when training begins (after a resume has restored it)."""

    def __init__(self, trainer) -> None:
        from transformers import TrainerCallback

        recorder = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                recorder.tracker_at_start = recorder.tracker()

            def on_step_end(self, args, state, control, **kwargs):
                recorder.record(state.global_step)

        self.trainer, self.latest, self.tracker_at_start = trainer, None, None
        self.steps: dict[int, dict[str, list]] = {}
        trainer.add_callback(Callback())
        trainer.add_batch_observer(self.observe)

    def observe(self, scored) -> None:
        if scored.mode == "train":
            self.latest = scored

    def tracker(self) -> list[float] | None:
        tracker = getattr(self.trainer, "quantile_tracker", None)
        return tracker.values.tolist() if tracker is not None and tracker.initialized else None

    def record(self, step: int) -> None:
        scored = self.latest
        entry = {
            "completion_ids": scored.outputs["completion_ids"].tolist(),
            "advantages": scored.outputs["advantages"].float().tolist(),
        }
        if scored.risk is not None:
            entry.update(
                tracker=self.tracker(),
                bundle_ids=scored.risk.bundle_ids.tolist(),
                advantages=scored.risk.advantages.float().tolist(),
            )
        self.steps[step] = entry


def steps_differing(full: dict[int, dict], resumed: dict[int, dict], steps) -> list[str]:
    """``"step N: key"`` for every recorded value of ``steps`` that the resumed run did not repeat exactly."""
    differing = []
    for step in steps:
        if step not in resumed or step not in full:
            differing.append(f"step {step}: not recorded")
            continue
        differing += [f"step {step}: {key}" for key in RECORDED if full[step].get(key) != resumed[step].get(key)]
    return differing


def first_step_metrics(log_history: list[dict[str, Any]]) -> dict[str, float]:
    """The loss, gradient norm and token entropy TRL logged for optimizer step 1."""
    entry = next((e for e in log_history if e.get("step") == 1 and "loss" in e), {})
    return {key: float(entry[key]) for key in ("loss", "grad_norm", "entropy") if key in entry}
