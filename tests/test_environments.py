"""TRL's agent training through RiskPOTrainer: tools, an environment that owns its data and reward, one that reads its
task from the dataset, and several environments routed by an ``environment``-only dataset. The environments, tools
and datasets are those of TRL's GRPO documentation ("Agent Training"); RiskPOTrainer must accept every dataset
GRPOTrainer trains on, and check exactly the columns TRL reads."""

from __future__ import annotations

import random

import pytest
from datasets import Dataset
from helpers import contains_digit_reward, make_prompt_dataset, tiny_config
from trl.chat_template_utils import qwen3_chat_template

from riskpo_trl import RiskPOConfig, RiskPOTrainer, job
from riskpo_trl.compat import generation
from riskpo_trl.tiny_model import build_tiny_model

# TRL refuses tools before transformers 5.0.0 and environment_factory before 5.2.0 (compat.generation).
needs_tools = pytest.mark.skipif(
    not generation.transformers_at_least(generation.TOOLS_NEED_TRANSFORMERS),
    reason=f"TRL's tools need transformers >= {generation.TOOLS_NEED_TRANSFORMERS}",
)
needs_environments = pytest.mark.skipif(
    not generation.transformers_at_least(generation.ENVIRONMENTS_NEED_TRANSFORMERS),
    reason=f"TRL's environment_factory needs transformers >= {generation.ENVIRONMENTS_NEED_TRANSFORMERS}",
)


class IncrementEnv:
    """TRL's minimal environment: it samples its own target, exposes `increment` as a tool and owns the reward."""

    def reset(self, **kwargs) -> str | None:
        self.counter = 0
        self.target = random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class DatasetIncrementEnv(IncrementEnv):
    """TRL's variant that reads the task from the dataset: the row's `target` column arrives in reset()."""

    def reset(self, target, **kwargs) -> None:
        self.counter = 0
        self.target = target


class CodingEnv:
    def reset(self, **kwargs) -> str:
        return f"Compute the {random.randint(1, 20)}th Fibonacci number."

    def run_code(self, code: str) -> str:
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.

        Returns:
            The captured standard output.
        """
        return ""


class GameEnv:
    def reset(self, **kwargs) -> str:
        return "Reach the goal tile."

    def move(self, action: str) -> str:
        """Apply an action to the game and return the new observation.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The observation after the move.
        """
        return "moved"


def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_add(a: int, b: int) -> int:
    """
    Asynchronously adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of the two integers.
    """
    return a + b


def environment_type_reward(environments, **kwargs) -> list[float]:
    """A reward that reads the environments TRL passes, as in TRL's multi-environment example."""
    return [float(isinstance(env, CodingEnv)) for env in environments]


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory) -> str:
    """The tiny model with Qwen3's chat template, which renders tool calls (TRL refuses tools otherwise)."""
    path = tmp_path_factory.mktemp("tiny-tools")
    _, tokenizer = build_tiny_model(path)
    tokenizer.chat_template = qwen3_chat_template
    tokenizer.save_pretrained(path)
    return str(path)


def config(tmp_path, **overrides) -> RiskPOConfig:
    settings = dict(
        output_dir=str(tmp_path),
        max_steps=2,
        num_generations=2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        bundle_size=2,
        max_completion_length=8,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        chat_template_kwargs={"enable_thinking": False},
    )
    return tiny_config(settings.pop("output_dir"), run=False, **{**settings, **overrides})


def test_columns_follow_what_trl_reads(tmp_path):
    """Checked before the model loads (the path does not exist): 'prompt' is optional with an environment, the
    'environment' column is required with a dict of them, and 'prompt' stays required without."""
    routing = Dataset.from_dict({"environment": ["coding", "game"] * 2})
    missing_model = str(tmp_path / "no-model")
    with pytest.raises(ValueError, match=r"no 'prompt' column \(its columns: \['environment'\]\)"):
        job.build(
            RiskPOTrainer,
            missing_model,
            reward_funcs=contains_digit_reward,
            args=config(tmp_path),
            train_dataset=routing,
        )
    with pytest.raises(ValueError, match=r"no 'environment' column .*\(\['coding', 'game'\]\)"):
        job.build(
            RiskPOTrainer,
            missing_model,
            reward_funcs=contains_digit_reward,
            args=config(tmp_path),
            train_dataset=make_prompt_dataset(),
            environment_factory={"coding": CodingEnv, "game": GameEnv},
        )
    # Accepted: the next check to fail is the model path's, so the dataset passed.
    with pytest.raises(FileNotFoundError, match="no such directory"):
        job.build(
            RiskPOTrainer,
            missing_model,
            reward_funcs=environment_type_reward,
            args=config(tmp_path),
            train_dataset=routing,
            environment_factory={"coding": CodingEnv, "game": GameEnv},
        )


def train(model_dir, args, **kwargs) -> RiskPOTrainer:
    trainer = job.build(RiskPOTrainer, model_dir, args=args, **kwargs)
    trainer.train()
    assert trainer.state.global_step == args.max_steps
    assert trainer.quantile_tracker.num_updates == args.max_steps
    return trainer


@pytest.mark.slow
@needs_environments
def test_environment_that_owns_data_and_reward_trains_without_a_dataset(tool_model_dir, tmp_path):
    trainer = train(tool_model_dir, config(tmp_path), environment_factory=IncrementEnv)
    [entry, *_] = [e for e in trainer.state.log_history if "rewards/IncrementEnv/mean" in e]
    assert "risk/mvar" in entry


@pytest.mark.slow
@needs_environments
def test_environment_reads_its_task_from_the_dataset(tool_model_dir, tmp_path):
    dataset = Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
            "target": list(range(1, 7)),
        }
    )
    targets = []

    class RecordingEnv(DatasetIncrementEnv):
        def reset(self, target, **kwargs) -> None:
            targets.append(target)
            return super().reset(target, **kwargs)

    train(tool_model_dir, config(tmp_path), train_dataset=dataset, environment_factory=RecordingEnv)
    assert targets and set(targets) <= set(range(1, 7))  # every reset got a row's `target`


@pytest.mark.slow
@needs_environments
def test_environments_routed_by_an_environment_only_dataset(tool_model_dir, tmp_path):
    routing = Dataset.from_dict({"environment": ["coding", "game"] * 4})
    trainer = train(
        tool_model_dir,
        config(tmp_path),
        train_dataset=routing,
        reward_funcs=environment_type_reward,
        environment_factory={"coding": CodingEnv, "game": GameEnv},
    )
    rewards = [
        e["rewards/environment_type_reward/mean"]
        for e in trainer.state.log_history
        if "rewards/environment_type_reward/mean" in e
    ]
    assert rewards and all(0.0 < r < 1.0 for r in rewards)  # each batch mixes both environments


@pytest.mark.slow
@needs_tools
def test_sync_and_async_tools(tool_model_dir, tmp_path):
    trainer = train(
        tool_model_dir,
        config(tmp_path),
        train_dataset=make_prompt_dataset(8),
        reward_funcs=contains_digit_reward,
        tools=[multiply, async_add],
    )
    assert {tool.__name__ for tool in trainer.tools} == {"multiply", "async_add"}
