"""Server mode for real: the launcher's `trl vllm-serve` command on vLLM's CPU build, and the trainer against it.

One server for the module (it takes minutes to start on 2 shared cores). Its command line is the one
examples/launch/launch_single_node.sh prints with --dry-run (and the SLURM script too), with only the device setting
(CUDA_VISIBLE_DEVICES) dropped; the training command comes from the same dry run.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import contains_digit_reward, make_prompt_dataset

from riskpo_trl import RiskPOConfig, RiskPOTrainer
from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model

pytestmark = pytest.mark.vllm_real

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "examples/launch/launch_single_node.sh"
SLURM = ROOT / "examples/launch/slurm_riskpo.sh"
RECIPE = "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
START_TIMEOUT = 900  # seconds; vLLM's start-up is minutes on a loaded 2-core machine
CUDA_ONLY_SYNC = "Weight synchronization runs on vLLM's NCCL weight-transfer engine, which needs a CUDA device"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dry_run(script: Path, *args: str) -> dict[str, list[str]]:
    result = subprocess.run(["bash", str(script), "--dry-run", "--config", RECIPE, "--accelerate-config",
                             "recipes/accelerate_configs/cpu_single.yaml", *args],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    return {name: shlex.split(lines[name]) for name in ("vllm", "train")}


def launcher_commands(model_dir: str, port: int, *extra: str) -> dict[str, list[str]]:
    """The two commands launch_single_node.sh would run, without the device setting (there is no GPU here)."""
    commands = dry_run(LAUNCHER, "--vllm-gpus", "0", "--train-gpus", "1", "--port", str(port), "--model", model_dir,
                       "--", *extra)
    for name, command in commands.items():
        assert command[0] == "env" and command[1].startswith("CUDA_VISIBLE_DEVICES="), command
        commands[name] = command[2:]
    # The SLURM script serves with the very same command (one GPU per node here, so the same parallel sizes).
    slurm = dry_run(SLURM, "--gpus-per-node", "1", "--nodelist", "n1 n2", "--port", str(port), "--model", model_dir)
    assert slurm["vllm"] == commands["vllm"]
    return commands


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-served")
    build_tiny_model(path, **VLLM_CPU_SIZES, initializer_range=0.2)
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """The launcher's `trl vllm-serve`, healthy; yields its base URL and the launcher's training command."""
    port = free_port()
    output_dir = tmp_path_factory.mktemp("server-mode-run")
    commands = launcher_commands(model_dir, port, "--use_vllm", "true", "--model_name_or_path", model_dir,
                                 "--output_dir", str(output_dir), "--vllm_server_timeout", "60")
    assert commands["vllm"][:2] == ["trl", "vllm-serve"]
    log_path = tmp_path_factory.mktemp("server-log") / "vllm-serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(commands["vllm"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(base_url):
            if process.poll() is not None:
                pytest.fail(f"`{' '.join(commands['vllm'])}` exited ({process.returncode}):\n"
                            + log_path.read_text()[-4000:])
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not healthy after {START_TIMEOUT}s:\n" + log_path.read_text()[-4000:])
            time.sleep(2)
        yield {"url": base_url, "train": commands["train"], "log": log_path}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def healthy(base_url: str) -> bool:
    import requests  # the vllm extra's, not the dev install's: imported only where vLLM runs

    try:
        return requests.get(f"{base_url}/health", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_launcher_server_answers_health_models_and_generate(server, model_dir):
    import requests
    from trl.generation.vllm_client import VLLMClient

    assert requests.get(f"{server['url']}/health", timeout=10).status_code == 200
    assert [m["id"] for m in requests.get(f"{server['url']}/v1/models", timeout=10).json()["data"]] == [model_dir]

    client = VLLMClient(base_url=server["url"], connection_timeout=60)
    # What the trainer relies on: the NCCL weight-transfer engine `trl vllm-serve` turns on, and one server rank.
    assert client.get_server_info()["weight_transfer_config"] == {"backend": "nccl"}
    assert client.get_world_size() == 1
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {i} + 1?"}], tokenize=True,
                                             add_generation_prompt=True, return_dict=False) for i in range(3)]
    # Token-id prompts, as the trainer sends them, with its sampling settings.
    out = client.generate(prompts, n=4, temperature=1.0, max_tokens=16, logprobs=0)
    assert out["prompt_ids"] == prompts
    assert len(out["completion_ids"]) == 3 * 4
    assert all(1 <= len(ids) <= 16 for ids in out["completion_ids"])
    assert [len(lps) for lps in out["logprobs"]] == [len(ids) for ids in out["completion_ids"]]
    assert all(lp[0] <= 0 for lps in out["logprobs"] for lp in lps)


def test_launcher_training_command_stops_at_the_nccl_weight_sync(server):
    """TRL's server mode pushes weights over NCCL only: the launcher's training command reaches the server, then
    stops where the trainer opens the weight-transfer group, before any step."""
    result = subprocess.run(server["train"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    assert f"NotImplementedError: {CUDA_ONLY_SYNC}, got 'cpu" in result.stderr, result.stderr[-4000:]
    assert "init_communicator" in result.stderr
    assert "[step 1/" not in result.stdout + result.stderr


def test_riskpo_trains_on_completions_generated_by_the_server(server, model_dir, tmp_path):
    """The furthest real point of server mode on CPU: RiskPOTrainer trains on completions the server generates,
    through TRL's rollout_func (experimental), with use_vllm=False, so no weight sync is attempted: the server
    keeps the initial weights (off-policy after the first step, which is fine for a plumbing test)."""
    from trl.generation.vllm_client import VLLMClient

    client = VLLMClient(base_url=server["url"], connection_timeout=60)
    calls = []

    def server_rollout(prompts, trainer):
        tokenizer = trainer.processing_class
        prompt_ids = [tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True,
                                                    return_dict=False) for prompt in prompts]
        out = client.generate(prompt_ids, n=1, temperature=trainer.args.temperature,
                              max_tokens=trainer.args.max_completion_length, logprobs=0)
        calls.append(out["completion_ids"])
        return {"prompt_ids": out["prompt_ids"], "completion_ids": out["completion_ids"],
                "logprobs": [[lp[0] for lp in lps] for lps in out["logprobs"]]}

    args = RiskPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, num_generations=4,
                        bundle_size=2, gradient_accumulation_steps=1, steps_per_generation=1,
                        max_completion_length=16, learning_rate=1e-3, logging_steps=1, report_to="none",
                        save_strategy="no", use_cpu=True, bf16=False, use_vllm=False, seed=7)
    trainer = RiskPOTrainer(model_dir, reward_funcs=contains_digit_reward, args=args, train_dataset=make_prompt_dataset(),
                            rollout_func=server_rollout)
    trainer.train()
    assert len(calls) == 2 and all(len(batch) == 8 for batch in calls)  # one generation batch per step
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2 and all("risk/mvar" in entry for entry in logs)
