"""Draw the documentation's training-curve figures: a tiny RiskPO run and a tiny GRPO run on CPU, then riskpo-plot.

Both runs train the same randomly initialised tiny Qwen2 (riskpo_trl.tiny_model) for a few dozen steps on made-up
arithmetic prompts with a toy reward (1 if the completion contains a digit), logging held-out Pass@k with
PassAtKCallback. The point is the figure's layout and what each panel means, not the numbers.

    python docs/images/make_training_curves.py                          # figures in the work directory
    python docs/images/make_training_curves.py --output-dir docs/images  # replace the documentation's figures

The documentation's own figures (tracked files) are only replaced when --output-dir names their directory.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

STEPS = 30
FIGURES = ("training_curves", "logprob_diagnostic")


def digit_reward(completions, **kwargs) -> list[float]:
    return [float(any(ch.isdigit() for ch in c[0]["content"])) for c in completions]


def digit_scorer(completion: str, gold: str) -> float:
    return float(any(ch.isdigit() for ch in completion))


def prompts(num: int, offset: int = 0):
    from datasets import Dataset

    rows = [
        {"prompt": [{"role": "user", "content": f"What is {i} + {i % 7}?"}], "solution": str(i + i % 7)}
        for i in range(offset, offset + num)
    ]
    return Dataset.from_list(rows)


def train(name: str, model_dir: str, work_dir: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    from riskpo_trl import RiskPOConfig, RiskPOTrainer
    from riskpo_trl.evaluation import PassAtKCallback

    common = dict(
        output_dir=str(work_dir / name),
        max_steps=STEPS,
        learning_rate=3e-3,
        max_completion_length=16,
        num_generations=4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        seed=0,
        bf16=False,
        temperature=0.8,
    )
    if name == "RiskPO":
        trainer = RiskPOTrainer(
            model_dir, reward_funcs=digit_reward, args=RiskPOConfig(bundle_size=2, **common), train_dataset=prompts(64)
        )
    else:
        trainer = GRPOTrainer(
            model_dir, reward_funcs=digit_reward, args=GRPOConfig(**common), train_dataset=prompts(64)
        )
    trainer.add_callback(
        PassAtKCallback(
            trainer,
            prompts(8, offset=100),
            num_samples=8,
            ks=[1, 8],
            eval_steps=10,
            max_new_tokens=16,
            scorer=digit_scorer,
        )
    )
    trainer.train()
    trainer.save_state()
    trainer.save_model()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="Where the model, the runs and the evaluations go (default: a new temporary directory).",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=None,
        help="Where the figures go (default: the work directory; docs/images replaces the "
        f"documentation's {', '.join(FIGURES)} figures).",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    from riskpo_trl.evaluation import EvalConfig, evaluate
    from riskpo_trl.evaluation.plots import load_run, plot_logprob_diagnostic, plot_training_curves
    from riskpo_trl.tiny_model import build_tiny_model

    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="riskpo-curves-"))
    images = args.output_dir or work_dir
    images.mkdir(parents=True, exist_ok=True)
    model_dir = str(work_dir / "tiny-model")
    build_tiny_model(model_dir)
    for name in ("RiskPO", "GRPO"):
        train(name, model_dir, work_dir)
    # Held-out problems in the evaluator's local-file format, scored with the same toy check as the training reward.
    held_out = work_dir / "held_out.jsonl"
    held_out.write_text(
        "".join(f'{{"problem": "What is {i} + {i % 7}?", "answer": "{i + i % 7}"}}\n' for i in range(200, 216))
    )
    for name in ("RiskPO", "GRPO"):
        config = EvalConfig(
            model=str(work_dir / name),
            dataset_files=[str(held_out)],
            num_samples=16,
            max_new_tokens=16,
            backend="transformers",
            logprobs=True,
            output_dir=str(work_dir / "eval" / name),
            overwrite=True,
        )  # the runs were retrained
        evaluate(config, scorer=digit_scorer)
    runs = [load_run(f"{name}={work_dir / name}") for name in ("RiskPO", "GRPO")]
    eval_results = [f"{name}={work_dir / 'eval' / name / 'results.json'}" for name in ("RiskPO", "GRPO")]
    paths, notes = plot_training_curves(
        runs,
        images / FIGURES[0],
        eval_results,
        smoothing=0.6,
        title="Tiny CPU runs (random 2-layer Qwen2, toy reward): layout demo",
    )
    samples = [f"{name}={work_dir / 'eval' / name / 'samples.jsonl'}" for name in ("RiskPO", "GRPO")]
    paths += plot_logprob_diagnostic(samples, images / FIGURES[1], num_bins=4)
    print("\n".join([*notes, *map(str, paths)]))


if __name__ == "__main__":
    main()
