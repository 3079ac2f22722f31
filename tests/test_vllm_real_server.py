"""Server mode for real: the launcher's `trl vllm-serve` on vLLM's CPU build, with this package's gloo weight sync,
and training against it.

One server for the module (it takes minutes to start on 2 shared cores). Its command line is the one
examples/launch/launch_single_node.sh prints with --dry-run and the CPU server's --vllm-args (the SLURM script serves
with the same command less those), with only the device setting (CUDA_VISIBLE_DEVICES) dropped; the training
commands come from the same dry run. The server runs in float32, so its log-probs equal the trained model's up to
LOGPROB_TOLERANCE.
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
import torch

from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model
from riskpo_trl.weight_sync import BACKEND, SERVER_ARGS

pytestmark = pytest.mark.vllm_real

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "examples/launch/launch_single_node.sh"
SLURM = ROOT / "examples/launch/slurm_riskpo.sh"
RECIPES = {"riskpo": "recipes/tiny/riskpo/config_tiny_arithmetic.yaml",
           "grpo": "recipes/tiny/grpo/config_tiny_arithmetic.yaml"}
START_TIMEOUT = 900  # seconds; vLLM's start-up is minutes on a loaded 2-core machine
STEPS = 3
# float32 on both sides; the same weights give log-probs within ~1e-5 here, one optimizer step moves them by ~1e-2.
LOGPROB_TOLERANCE = 1e-4
# Fixed sequences whose log-probs are compared (every position after the first).
TEXTS = ("What is 3 + 4? The answer is 7.", "Hello world, numbers 12345 and 678.")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dry_run(script: Path, recipe: str, *args: str) -> dict[str, list[str]]:
    result = subprocess.run(["bash", str(script), "--dry-run", "--config", recipe, "--accelerate-config",
                             "recipes/accelerate_configs/cpu_single.yaml", *args],
                            cwd=ROOT, capture_output=True, text=True, check=True)
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    return {name: shlex.split(lines[name]) for name in ("vllm", "train")}


def launcher_commands(recipe: str, model_dir: str, port: int, *extra: str) -> dict[str, list[str]]:
    """The two commands launch_single_node.sh would run for a CPU server, without the device setting."""
    commands = dry_run(LAUNCHER, recipe, "--vllm-gpus", "0", "--train-gpus", "1", "--port", str(port), "--model",
                       model_dir, "--vllm-args", shlex.join(SERVER_ARGS), "--", *extra)
    for name, command in commands.items():
        assert command[0] == "env" and command[1].startswith("CUDA_VISIBLE_DEVICES="), command
        commands[name] = command[2:]
    assert commands["vllm"][-len(SERVER_ARGS):] == list(SERVER_ARGS)
    # The SLURM script serves with the same command less --vllm-args (one GPU per node here: the same sizes).
    slurm = dry_run(SLURM, recipe, "--gpus-per-node", "1", "--nodelist", "n1 n2", "--port", str(port), "--model",
                    model_dir)
    assert slurm["vllm"] == commands["vllm"][:-len(SERVER_ARGS)]
    return commands


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-served")
    build_tiny_model(path, **VLLM_CPU_SIZES, initializer_range=0.2)
    return str(path)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """The launcher's CPU `trl vllm-serve`, healthy; yields its base URL and the launcher's training command for each
    recipe (finished by `train_command`)."""
    port = free_port()
    train_args = ("--use_vllm", "true", "--vllm_server_timeout", "60",
                  "--max_steps", str(STEPS), "--save_steps", "1", "--learning_rate", "1e-3")
    commands = {name: launcher_commands(recipe, model_dir, port, *train_args) for name, recipe in RECIPES.items()}
    serve = commands["riskpo"]["vllm"]
    assert serve[:2] == ["trl", "vllm-serve"] and commands["grpo"]["vllm"] == serve
    log_path = tmp_path_factory.mktemp("server-log") / "vllm-serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(serve, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not healthy(base_url):
            if process.poll() is not None:
                pytest.fail(f"`{shlex.join(serve)}` exited ({process.returncode}):\n" + log_path.read_text()[-4000:])
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM server not healthy after {START_TIMEOUT}s:\n" + log_path.read_text()[-4000:])
            time.sleep(2)
        yield {"url": base_url, "train": {name: c["train"] for name, c in commands.items()}, "log": log_path}
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


def train_command(server, trainer: str, output_dir: Path) -> list[str]:
    # A weight-sync port of its own per run: the last run's may still be in TIME_WAIT.
    return [*server["train"][trainer], "--output_dir", str(output_dir), "--vllm_group_port", str(free_port())]


def plain_client(server):
    from trl.generation.vllm_client import VLLMClient

    return VLLMClient(base_url=server["url"], connection_timeout=60)


def sequences(model_dir: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(text)["input_ids"] for text in TEXTS]


def server_logprobs(client, seqs: list[list[int]]) -> list[torch.Tensor]:
    """The server's log-prob of each token of each sequence after the first (prompt log-probs, temperature 1)."""
    out = client.get_sequence_logprobs(seqs, [1] * len(seqs), top_logprobs=1)
    return [torch.tensor([position[0] for position in seq]) for seq in out["actual_logprobs"]]


def model_logprobs(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    """The same log-probs from a transformers model (a directory or a loaded model), in float32."""
    from transformers import AutoModelForCausalLM

    if isinstance(model, str | Path):
        model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    result = []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq])
            logprobs = model(ids).logits.float().log_softmax(-1)[0, :-1]
            result.append(logprobs.gather(-1, ids[0, 1:, None])[:, 0])
    return result


def largest_gap(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(first, second, strict=True))


def test_launcher_server_answers_health_models_and_generate(server, model_dir):
    import requests

    assert requests.get(f"{server['url']}/health", timeout=10).status_code == 200
    assert [m["id"] for m in requests.get(f"{server['url']}/v1/models", timeout=10).json()["data"]] == [model_dir]

    client = plain_client(server)
    # What the trainers rely on: this package's weight-transfer engine (named by --vllm-args), float32, one rank.
    info = client.get_server_info()
    assert info["weight_transfer_config"] == {"backend": BACKEND}
    assert info["model_config"]["dtype"] in ("float32", "torch.float32")
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


def test_launcher_training_command_trains_riskpo_in_server_mode_and_the_server_ends_with_its_weights(
        server, model_dir, tmp_path):
    """The launcher's training command (accelerate, `--vllm_mode server`) trains STEPS steps and syncs its weights
    before each generation batch after the first; the server then holds the weights of step STEPS - 1 (the last
    sync), which differ from the initial ones."""
    served = train_in_server_mode(server, "riskpo", tmp_path, model_dir)
    assert largest_gap(served, model_logprobs(model_dir, sequences(model_dir))) > 100 * LOGPROB_TOLERANCE


def test_the_grpo_baseline_trains_in_server_mode_through_the_same_sync(server, model_dir, tmp_path):
    """GRPO, through the training script's hook for the baselines. The tiny model earns no reward, so GRPO's
    advantages are 0 and its weights stay as they start: it starts from another random model than the one served, so
    that the sync shows (the server ends with that model's weights)."""
    start = tmp_path / "start"
    build_tiny_model(start, **VLLM_CPU_SIZES, initializer_range=0.2, seed=1)
    served = train_in_server_mode(server, "grpo", tmp_path / "run", start)
    assert largest_gap(served, model_logprobs(model_dir, sequences(model_dir))) > 100 * LOGPROB_TOLERANCE


def train_in_server_mode(server, trainer: str, output_dir: Path, start) -> list[torch.Tensor]:
    """Run the launcher's training command from the model ``start``; check that it trained STEPS steps and that the
    server holds the weights of the last sync (the checkpoint of step STEPS - 1); return the server's log-probs."""
    command = [*train_command(server, trainer, output_dir), "--model_name_or_path", str(start)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert f"[step {STEPS}/{STEPS}]" in output

    seqs = sequences(str(start))
    served = server_logprobs(plain_client(server), seqs)
    assert largest_gap(served, model_logprobs(output_dir / f"checkpoint-{STEPS - 1}", seqs)) < LOGPROB_TOLERANCE
    return served


def test_a_sync_lands_tied_head_included_and_a_sync_that_moves_nothing_fails_loudly(server, model_dir):
    """The trainers' client on its own: a sync that changes only the (tied) embedding lands, LM head included (vLLM's
    CPU build computes the head from a packed copy, which the engine packs again when the update finishes); then a
    sync whose transfer moves nothing is caught by the check after the update."""
    from transformers import AutoModelForCausalLM
    from trl.generation.vllm_client import VLLMClient

    from riskpo_trl.weight_sync.client import WeightSyncError, open_client

    client = open_client(VLLMClient, False, base_url=server["url"], group_port=free_port(), connection_timeout=60)
    assert type(client).__name__ == "GlooVLLMClient"
    client.init_communicator(device="cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    seqs = sequences(model_dir)
    before = model_logprobs(model, seqs)
    metadata = [(name, "float32", list(param.shape)) for name, param in model.named_parameters()]

    def sync():
        client.update_named_params(metadata, ((name, param.data) for name, param in model.named_parameters()))
        client.reset_prefix_cache()

    torch.manual_seed(0)
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(0.1 * torch.randn_like(model.model.embed_tokens.weight))
    sync()
    changed = model_logprobs(model, seqs)
    assert largest_gap(changed, before) > 100 * LOGPROB_TOLERANCE
    assert largest_gap(server_logprobs(client, seqs), changed) < LOGPROB_TOLERANCE

    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)
    client._transfer = lambda update_info, named_params: [None for _ in named_params]  # reports success, sends nothing
    with pytest.raises(WeightSyncError, match="holds other values than the trainer sent"):
        sync()
    # The server kept the weights of the last sync that landed.
    assert largest_gap(server_logprobs(client, seqs), changed) < LOGPROB_TOLERANCE
