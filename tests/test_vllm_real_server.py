"""Server mode for real: the launcher's `trl vllm-serve` on vLLM's CPU build, with this package's gloo weight sync,
and training against it; and the faults the sync's checks must catch.

Three servers, started together once for the module (each takes minutes on 2 shared cores):
- the launcher's CPU server: its command line is the one examples/launch/launch_single_node.sh prints with --dry-run
  and the CPU server's --vllm-args (the SLURM script serves with the same command less those), with the device
  setting (CUDA_VISIBLE_DEVICES) dropped and one argument added: ``--worker-extension-cls`` names the engine's
  extension with a fault switch (tests/vllm_faults.py). It runs in float32, so its log-probs equal the trained
  model's up to LOGPROB_TOLERANCE;
- the same less ``--dtype float32`` (vLLM's CPU default, bfloat16), eager: a server the trainers must refuse, and the
  stand-in for a restarted server (another server process answering at the trainer's address);
- a plain TRL server (the launcher's command without --vllm-args: NCCL weight transfer), eager.

The module's last test kills the CPU server (SIGKILL, under a two-process run); the ``server`` fixture fails any test
that would get it after that.
"""

from __future__ import annotations

import gc
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model
from riskpo_trl.weight_sync import BACKEND, SERVER_ARGS

pytestmark = pytest.mark.vllm_real

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "examples/launch/launch_single_node.sh"
SLURM = ROOT / "examples/launch/slurm_riskpo.sh"
RECIPES = {
    "riskpo": "recipes/tiny/riskpo/config_tiny_arithmetic.yaml",
    "grpo": "recipes/tiny/grpo/config_tiny_arithmetic.yaml",
}
START_TIMEOUT = 900  # seconds; vLLM's start-up is minutes on a loaded 2-core machine
FAULT_EXTENSION = ("--worker-extension-cls", "vllm_faults.FaultInjectionExtension")
BF16_ARGS = tuple(arg for arg in SERVER_ARGS if arg not in ("--dtype", "float32"))
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
    result = subprocess.run(
        [
            "bash",
            str(script),
            "--dry-run",
            "--config",
            recipe,
            "--accelerate-config",
            "recipes/accelerate_configs/cpu_single.yaml",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    return {name: shlex.split(lines[name]) for name in ("vllm", "train")}


def launcher_commands(
    recipe: str, model_dir: str, port: int, *extra: str, vllm_args: tuple[str, ...] = SERVER_ARGS
) -> dict[str, list[str]]:
    """The two commands launch_single_node.sh would run for a server with ``vllm_args``, without the device
    setting."""
    commands = dry_run(
        LAUNCHER,
        recipe,
        "--vllm-gpus",
        "0",
        "--train-gpus",
        "1",
        "--port",
        str(port),
        "--model",
        model_dir,
        "--vllm-args",
        shlex.join(vllm_args),
        "--",
        *extra,
    )
    for name, command in commands.items():
        assert command[0] == "env" and command[1].startswith("CUDA_VISIBLE_DEVICES="), command
        commands[name] = command[2:]
    if not vllm_args:
        return commands
    assert commands["vllm"][-len(vllm_args) :] == list(vllm_args)
    # The SLURM script serves with the same command less --vllm-args (one GPU per node here: the same sizes).
    slurm = dry_run(
        SLURM, recipe, "--gpus-per-node", "1", "--nodelist", "n1 n2", "--port", str(port), "--model", model_dir
    )
    assert slurm["vllm"] == commands["vllm"][: -len(vllm_args)]
    return commands


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-served")
    build_tiny_model(path, **VLLM_CPU_SIZES, initializer_range=0.2)
    return str(path)


TRAIN_ARGS = (
    "--use_vllm",
    "true",
    "--vllm_server_timeout",
    "60",
    "--max_steps",
    str(STEPS),
    "--save_steps",
    "1",
    "--learning_rate",
    "1e-3",
)


@pytest.fixture(scope="module")
def launched(model_dir, tmp_path_factory):
    """The module's three servers, started at once (see the module docstring); the fixtures below wait for theirs.
    Yields name -> {"url", "train" (the launcher's training command per recipe), "process", "log", "command"}."""
    specs = {
        "cpu": (SERVER_ARGS, FAULT_EXTENSION),
        "bf16": (BF16_ARGS, ("--enforce-eager",)),
        "plain": ((), ("--enforce-eager",)),
    }
    servers = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    try:
        for name, (vllm_args, added) in specs.items():
            port = free_port()
            commands = {
                recipe: launcher_commands(path, model_dir, port, *TRAIN_ARGS, vllm_args=vllm_args)
                for recipe, path in RECIPES.items()
            }
            serve = [*commands["riskpo"]["vllm"], *added]
            assert serve[:2] == ["trl", "vllm-serve"] and commands["grpo"]["vllm"] == commands["riskpo"]["vllm"]
            log_path = tmp_path_factory.mktemp(f"server-{name}") / "vllm-serve.log"
            with log_path.open("w") as log:
                process = subprocess.Popen(
                    serve, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            servers[name] = {
                "url": f"http://127.0.0.1:{port}",
                "process": process,
                "log": log_path,
                "command": serve,
                "train": {recipe: c["train"] for recipe, c in commands.items()},
            }
        yield servers
    finally:
        for entry in servers.values():
            stop(entry["process"])


def stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def wait_healthy(entry: dict) -> dict:
    deadline = time.monotonic() + START_TIMEOUT
    while not healthy(entry["url"]):
        if entry["process"].poll() is not None:
            pytest.fail(
                f"`{shlex.join(entry['command'])}` exited ({entry['process'].returncode}):\n"
                + entry["log"].read_text()[-4000:]
            )
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM server not healthy after {START_TIMEOUT}s:\n" + entry["log"].read_text()[-4000:])
        time.sleep(2)
    return entry


@pytest.fixture(scope="module")
def healthy_server(launched):
    return wait_healthy(launched["cpu"])


@pytest.fixture
def server(healthy_server):
    """The launcher's CPU server (float32, this package's engine), healthy, unless a test killed it."""
    if "killed by" in healthy_server:
        pytest.fail(f"The module's server was killed by {healthy_server['killed by']}, which must stay the last test.")
    return healthy_server


@pytest.fixture(scope="module")
def bf16_server(launched):
    return wait_healthy(launched["bf16"])


@pytest.fixture(scope="module")
def plain_server(launched):
    return wait_healthy(launched["plain"])


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
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i} + 1?"}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=False,
        )
        for i in range(3)
    ]
    # Token-id prompts, as the trainer sends them, with its sampling settings.
    out = client.generate(prompts, n=4, temperature=1.0, max_tokens=16, logprobs=0)
    assert out["prompt_ids"] == prompts
    assert len(out["completion_ids"]) == 3 * 4
    assert all(1 <= len(ids) <= 16 for ids in out["completion_ids"])
    assert [len(lps) for lps in out["logprobs"]] == [len(ids) for ids in out["completion_ids"]]
    assert all(lp[0] <= 0 for lps in out["logprobs"] for lp in lps)


def test_launcher_training_command_trains_riskpo_in_server_mode_and_the_server_ends_with_its_weights(
    server, model_dir, tmp_path
):
    """The launcher's training command (accelerate, `--vllm_mode server`) trains STEPS steps and syncs its weights
    before each generation batch after the first; the server then holds the weights of step STEPS - 1 (the last
    sync), which differ from the initial ones."""
    served = train_in_server_mode(server, "riskpo", tmp_path, model_dir)
    assert largest_gap(served, model_logprobs(model_dir, sequences(model_dir))) > 100 * LOGPROB_TOLERANCE


def test_the_grpo_baseline_trains_in_server_mode_through_the_same_sync(server, model_dir, tmp_path):
    """GRPO, through the training script's hook for the baselines, run in this process (the command's interpreter
    start-up is most of a run here; RiskPO's run above goes through accelerate). The tiny model earns no reward, so
    GRPO's advantages are 0 and its weights stay as they start: it starts from another random model than the one
    served, so that the sync shows (the server ends with that model's weights)."""
    start = tmp_path / "start"
    build_tiny_model(start, **VLLM_CPU_SIZES, initializer_range=0.2, seed=1)
    served = train_in_server_mode(server, "grpo", tmp_path / "run", start, in_process=True)
    assert largest_gap(served, model_logprobs(model_dir, sequences(model_dir))) > 100 * LOGPROB_TOLERANCE


def train_in_server_mode(
    server, trainer: str, output_dir: Path, start, in_process: bool = False
) -> list[torch.Tensor]:
    """Run the launcher's training command from the model ``start`` (``in_process``: its training script, in this
    process); check that it trained STEPS steps and that the server holds the weights of the last sync (the
    checkpoint of step STEPS - 1); return the server's log-probs."""
    command = [*train_command(server, trainer, output_dir), "--model_name_or_path", str(start)]
    if in_process:
        from helpers import release_in_process_vllm

        from riskpo_trl.scripts.train import cli

        try:
            cli(command[command.index("riskpo_trl.scripts.train") + 1 :])
        finally:
            release_in_process_vllm()
    else:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        assert f"[step {STEPS}/{STEPS}]" in output
    assert (output_dir / f"checkpoint-{STEPS}").is_dir()

    seqs = sequences(str(start))
    served = server_logprobs(plain_client(server), seqs)
    assert largest_gap(served, model_logprobs(output_dir / f"checkpoint-{STEPS - 1}", seqs)) < LOGPROB_TOLERANCE
    return served


def gloo_client(server, group_port: int | None = None, **settings):
    """The trainers' client for ``server``, its weight sync set up; it checks every sync unless ``settings`` say
    otherwise."""
    from trl.generation.vllm_client import VLLMClient

    from riskpo_trl.weight_sync.bounded import SyncSettings
    from riskpo_trl.weight_sync.client import open_client

    client = open_client(
        VLLMClient,
        False,
        SyncSettings(**{"check_every": 1, **settings}),
        base_url=server["url"],
        group_port=group_port or free_port(),
        connection_timeout=60,
    )
    assert type(client).__name__ == "GlooVLLMClient"
    client.init_communicator(device="cpu")
    return client


def load_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


def sync(client, model, suppressed: bool = False) -> None:
    """What TRL's sync_weights does with the trainer's model; ``suppressed``: the transfer reports success and sends
    nothing (the server's update starts and finishes without a tensor)."""
    metadata = [(name, "float32", list(param.shape)) for name, param in model.named_parameters()]
    if suppressed:
        client._transfer = lambda update_info, named_params: [None for _ in named_params]
    try:
        client.update_named_params(metadata, ((name, param.data) for name, param in model.named_parameters()))
        client.reset_prefix_cache()
    finally:
        client.__dict__.pop("_transfer", None)


def assert_probe(client, model, passes: bool) -> None:
    from riskpo_trl.weight_sync.client import WeightSyncError
    from riskpo_trl.weight_sync.probe import check_probe, model_logprobs, probe_tokens

    token_ids = probe_tokens(model.config.vocab_size)
    if passes:
        check_probe(client, token_ids, model_logprobs(model, token_ids))
    else:
        with pytest.raises(WeightSyncError, match="largest gap"):
            check_probe(client, token_ids, model_logprobs(model, token_ids))


def change_linear(model, generator):
    for name, param in model.named_parameters():
        if name.endswith("_proj.weight"):
            param.add_(0.05 * torch.randn(param.shape, generator=generator))


def change_embedding(model, generator):
    model.model.embed_tokens.weight.add_(0.1 * torch.randn(model.model.embed_tokens.weight.shape, generator=generator))


def change_norm(model, generator):
    model.model.norm.weight.mul_(1.5)


def merge_lora(model, generator, rank: int = 4):
    """What merging a LoRA adapter of q_proj and v_proj does: a low-rank product added to those weights only."""
    for layer in model.model.layers:
        for projection in (layer.self_attn.q_proj, layer.self_attn.v_proj):
            out_features, in_features = projection.weight.shape
            down = 0.3 * torch.randn(rank, in_features, generator=generator)
            up = 0.3 * torch.randn(out_features, rank, generator=generator)
            projection.weight.add_(up @ down)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            change_linear,
            r"model\.layers\.0\.self_attn\.qkv_proj\.weight on worker 0 "
            r"\(as model\.layers\.0\.self_attn\.q_proj",
        ),
        (change_embedding, r"model\.embed_tokens\.weight on worker 0 \(as model\.embed_tokens\.weight\)"),
        (change_norm, r"model\.norm\.weight on worker 0 \(as model\.norm\.weight\)"),
        (merge_lora, r"qkv_proj\.weight on worker 0 \(as model\.layers\.0\.self_attn\.q_proj\.weight\)"),
    ],
    ids=["linear", "embedding", "norm", "lora-merge"],
)
def test_an_update_of_each_kind_lands_and_one_whose_transfer_is_suppressed_raises_naming_it(
    server, model_dir, change, named
):
    """Each kind of update changes only its own parameters; with the transfer suppressed, the check after the update
    names the first stale one (in the server's layout: fused, padded), and the probe sees the gap; sent for real, the
    update lands and both checks pass."""
    from riskpo_trl.weight_sync.client import WeightSyncError

    client = gloo_client(server)
    model = load_model(model_dir)
    sync(client, model)  # the server starts from this test's model, whatever the last test left
    with torch.no_grad():
        change(model, torch.Generator().manual_seed(0))
    with pytest.raises(WeightSyncError, match=named):
        sync(client, model, suppressed=True)
    assert_probe(client, model, passes=False)
    sync(client, model)
    assert_probe(client, model, passes=True)
    assert (
        largest_gap(server_logprobs(client, sequences(model_dir)), model_logprobs(model, sequences(model_dir)))
        < LOGPROB_TOLERANCE
    )


def test_a_tied_lm_head_the_engine_leaves_stale_is_caught(server, model_dir):
    """With the engine's re-pack of the tied LM head switched off, an update of the embedding lands in the embedding
    and not in the head that generation multiplies with: the check names the head, and the probe sees the gap."""
    from riskpo_trl.weight_sync.client import WeightSyncError

    client = gloo_client(server)
    model = load_model(model_dir)
    sync(client, model)
    with torch.no_grad():
        change_embedding(model, torch.Generator().manual_seed(1))
    client.control("POST", "/collective_rpc", json={"method": "riskpo_test_skip_tied_repack", "args": ["true"]})
    try:
        with pytest.raises(
            WeightSyncError,
            match=r"1 problems\): lm_head\.weight on worker 0 \(as "
            r"model\.embed_tokens\.weight\): checksum",
        ):
            sync(client, model)
        assert_probe(client, model, passes=False)
    finally:
        client.control("POST", "/collective_rpc", json={"method": "riskpo_test_skip_tied_repack", "args": ["false"]})
    sync(client, model)
    assert_probe(client, model, passes=True)


def test_a_replaced_server_is_caught_before_generation_and_before_a_sync_naming_the_step(
    server, bf16_server, model_dir
):
    """The trainer's address answered by another server process (as after a restart on the same port): generation
    and the next sync raise before anything reaches training; through the trainers' sync hook the error names the
    server and the step. A server that no longer answers fails the sync the same way."""
    from riskpo_trl.weight_sync.client import WeightSyncError
    from riskpo_trl.weight_sync.probe import check_weight_syncs

    client = gloo_client(server)
    model = load_model(model_dir)
    generation = SimpleNamespace(
        mode="server", vllm_client=client, model=model, sync_weights=lambda: sync(client, model)
    )
    trainer = SimpleNamespace(
        vllm_generation=generation,
        accelerator=SimpleNamespace(num_processes=1),
        state=SimpleNamespace(global_step=5),
        args=SimpleNamespace(),
    )
    check_weight_syncs(trainer)
    generation.sync_weights()  # checked, probe included
    assert client.generate([[1, 2, 3]], max_tokens=2)["completion_ids"]

    client.base_url = bf16_server["url"]  # another process at the same address
    with pytest.raises(WeightSyncError, match="Before generation: .* restarted or replaced"):
        client.generate([[1, 2, 3]], max_tokens=2)
    trainer.state.global_step = 6
    with pytest.raises(
        WeightSyncError,
        match=rf"Weight sync to {bf16_server['url']} before the generation at step 6: "
        "Before the weight sync: .* restarted or replaced",
    ):
        generation.sync_weights()
    client.base_url = f"http://127.0.0.1:{free_port()}"  # nothing answers there
    with pytest.raises(
        WeightSyncError,
        match=r"at step 6: Before the weight sync: The vLLM server at .* did not "
        r"answer /collective_rpc",
    ):
        generation.sync_weights()


def test_an_occupied_group_port_fails_at_once_naming_it_and_leaves_the_server_usable(server):
    """The trainer opens the group's port before it asks the server to join, so a port held by another process
    fails there (the server is never asked) instead of hanging both."""
    from riskpo_trl.weight_sync.client import ServerRefusedError

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        outcome = {}

        def set_up():
            try:
                gloo_client(server, group_port=port)
            except Exception as error:  # reported below
                outcome["error"] = error

        setting_up = threading.Thread(target=set_up, daemon=True)
        setting_up.start()
        setting_up.join(120)  # a hang fails the test instead of the job
        assert not setting_up.is_alive(), "the set-up hangs on an occupied port"
    assert isinstance(outcome.get("error"), ServerRefusedError), outcome
    assert f"weight-sync group port {port}" in str(outcome["error"]) and "--vllm_group_port" in str(outcome["error"])
    gloo_client(server)  # the server was not left waiting


def one_error_line(command: list[str], tmp_path: Path, capsys) -> tuple[str, list[str]]:
    """Run the training script of a launcher's training command in this process (its interpreter start-up is most of
    a run here; the launcher's ``accelerate launch --quiet`` adds no line of its own, tested with --dry-run), for a
    start-up that must fail; return its one ``error:`` line and all its stderr lines."""
    from helpers import release_in_process_vllm

    from riskpo_trl.scripts.train import cli

    argv = command[command.index("riskpo_trl.scripts.train") + 1 :]
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as stopped:  # any other exception would be a traceback
            cli([*argv, "--output_dir", str(tmp_path / "run"), "--vllm_group_port", str(free_port())])
    finally:
        release_in_process_vllm()
    assert stopped.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1, errors
    assert errors[0].startswith("riskpo-train: error: ")
    return errors[0], lines


def test_a_bf16_server_is_refused_at_start_up_with_the_flag_to_add(bf16_server, tmp_path, capsys):
    line, _ = one_error_line(bf16_server["train"]["riskpo"], tmp_path, capsys)
    assert "runs in bfloat16 and the model trains in float32" in line and "--dtype float32" in line


def test_a_plain_trl_server_is_refused_with_one_error_line(plain_server, tmp_path, capsys):
    line, _ = one_error_line(plain_server["train"]["riskpo"], tmp_path, capsys)
    assert "'nccl' engine, which needs CUDA" in line and "--vllm-args" in line


def test_a_wrong_server_port_prints_a_waiting_line_first_and_fails_naming_the_address(server, tmp_path, capsys):
    port = free_port()
    command = [*server["train"]["riskpo"], "--vllm_server_port", str(port), "--vllm_server_timeout", "4"]
    line, lines = one_error_line(command, tmp_path, capsys)
    assert f"can't be reached at http://127.0.0.1:{port} after 4.0 seconds" in line, line
    waiting = f"Waiting up to 4 s for the vLLM server at http://127.0.0.1:{port} (vllm_server_timeout) ..."
    assert waiting in lines and lines.index(waiting) < lines.index(line)


class HangingServer:
    """A TCP server that accepts connections and never answers: a vLLM server stopped with SIGSTOP, as its clients
    see it; ``close``: it closes each connection at once, as a killed server's clients see it."""

    def __init__(self, close: bool = False):
        self.close = close

    def __enter__(self):
        import socket

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.accepted = []
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self):
        while True:
            try:
                connection = self.socket.accept()[0]
            except OSError:
                return
            if self.close:
                connection.recv(65536)
                connection.close()
            else:
                self.accepted.append(connection)

    def __exit__(self, *exc):
        self.socket.close()
        for connection in self.accepted:
            connection.close()


class TRLStandIn:
    """TRL's client as the mixins see it: a retrying session, ``base_url``, and ``generate`` through ``_post``."""

    def __init__(self, base_url):
        import requests
        from requests.adapters import HTTPAdapter, Retry

        self.base_url = base_url
        self.session = requests.Session()
        self.session.mount("http://", HTTPAdapter(max_retries=Retry(total=5, read=5, allowed_methods=["POST"])))
        self._updating_weights = False

    def generate(self, prompts, n=1, max_tokens=16, **kwargs):
        return self._post(f"{self.base_url}/v1/completions", json={"prompt": prompts, "n": n})


def bounded_client(base_url, **settings):
    from riskpo_trl.weight_sync.bounded import BoundedRequestsMixin, SyncSettings

    class Client(BoundedRequestsMixin, TRLStandIn):
        pass

    client = Client(base_url)
    client.settings = SyncSettings(**settings)
    return client


def test_a_generation_the_server_never_answers_times_out_once_naming_server_and_request():
    """No vLLM needed, but `requests` (the vllm extra's), which the main suite lacks."""
    from riskpo_trl.weight_sync.bounded import ServerTimeoutError

    with HangingServer() as server:
        client = bounded_client(server.url, generation_timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(
            ServerTimeoutError, match=rf"{server.url} did not answer /v1/completions \(generation\) within 1 s"
        ):
            client.generate([[1, 2]], n=2, max_tokens=4)
        assert time.monotonic() - started < 4  # no retry after the timeout (TRL's would wait 5 more times)
        assert len(server.accepted) == 1
        with pytest.raises(ServerTimeoutError, match=r"/start_weight_update \(a weight-sync request\) within 1 s"):
            bounded_client(server.url, sync_timeout_s=1.0).control("POST", "/start_weight_update", json={})


def run_training_in_process(command: list[str], *args: str) -> int:
    """The training script of a launcher's training command, run in this process (see `one_error_line`) with
    ``args`` added; returns its exit code (0 when it returns)."""
    from helpers import release_in_process_vllm

    from riskpo_trl.scripts.train import cli

    try:
        cli([*command[command.index("riskpo_trl.scripts.train") + 1 :], *args])
    except SystemExit as stopped:
        return stopped.code
    finally:
        release_in_process_vllm()
        gc.collect()  # the run's trainer, and with it the weight-sync group holding its port, as a new process has
    return 0


def stop_server(server, signal_number: int) -> None:
    """SIGSTOP or SIGCONT to every process of the server (the API server, its engine core and workers)."""
    os.killpg(server["process"].pid, signal_number)


@pytest.mark.parametrize("hang", ["generation", "sync"])
def test_a_server_that_hangs_stops_training_at_a_checkpoint_with_exit_75_and_the_same_command_resumes(
    server, model_dir, tmp_path, capsys, monkeypatch, hang
):
    """The server's processes stopped (SIGSTOP) right after the identity check before a generation, or as the first
    tensor of a sync leaves: the run ends within the configured timeout with one message naming the server, the
    request and the step, a checkpoint of the last step and exit code 75. After SIGCONT the same command resumes
    from that checkpoint, syncs (the server aborted the broken sync, if any, and takes the full one) and finishes."""
    from riskpo_trl.weight_sync.checked import CheckedClientMixin
    from riskpo_trl.weight_sync.gloo_client import GlooVLLMClient

    timeout = 40  # seconds; generous, as a generation on a loaded 2-core machine may take 15
    output_dir = tmp_path / "run"
    command = [
        *train_command(server, "riskpo", output_dir),
        "--model_name_or_path",
        model_dir,
        "--vllm_generation_timeout",
        str(timeout),
        "--vllm_sync_timeout",
        str(timeout),
    ]
    stopped_at = {}

    def stop_after_step_1(trainer_step: int) -> None:
        if trainer_step >= 1 and not stopped_at:
            stopped_at["time"] = time.monotonic()
            stop_server(server, signal.SIGSTOP)

    if hang == "generation":
        check_identity = CheckedClientMixin.check_identity

        def identity_then_stop(client, before):
            check_identity(client, before)
            if before == "generation":
                stop_after_step_1(client.syncs - 1)  # the first sync comes before step 0's generation

        monkeypatch.setattr(CheckedClientMixin, "check_identity", identity_then_stop)
    else:
        prepare = GlooVLLMClient.prepare_for_sending

        def stop_as_the_first_tensor_leaves(client, tensor):
            stop_after_step_1(client.syncs - 1)
            return prepare(client, tensor)

        monkeypatch.setattr(GlooVLLMClient, "prepare_for_sending", stop_as_the_first_tensor_leaves)
    try:
        code = run_training_in_process(command)
        ended = time.monotonic()
    finally:
        stop_server(server, signal.SIGCONT)
    output = capsys.readouterr()
    text = output.out + output.err
    assert stopped_at, f"the server was never stopped (exit code {code}):\n{text[-3000:]}"
    assert code == 75, text[-3000:]
    assert ended - stopped_at["time"] < 2 * timeout + 30, ended - stopped_at["time"]
    if hang == "generation":
        assert f"Generation by {server['url']} at step 1: " in text, text[-3000:]
        assert f"did not answer /v1/completions (generation) within {timeout} s" in text
    else:
        assert f"Weight sync to {server['url']} before the generation at step 1: " in text, text[-3000:]
        assert f"within {timeout} s" in text or f"transfer timeout {timeout} s" in text
    assert f"Stopped by a vLLM server timeout at step 1 of {STEPS}: saved" in text, text[-3000:]
    assert (output_dir / "checkpoint-1" / "trainer_state.json").is_file()

    monkeypatch.undo()
    capsys.readouterr()
    assert run_training_in_process(command) == 0
    assert "Resuming from" in capsys.readouterr().out
    assert (output_dir / f"checkpoint-{STEPS}").is_dir()
    seqs = sequences(model_dir)
    served = server_logprobs(plain_client(server), seqs)
    assert largest_gap(served, model_logprobs(output_dir / f"checkpoint-{STEPS - 1}", seqs)) < LOGPROB_TOLERANCE


class TimedRun:
    """A training command in its own session, each line of its merged output recorded with the time it arrived."""

    def __init__(self, command: list[str], env: dict[str, str]):
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.time(), line))

    def finish(self, timeout: float = 900) -> tuple[int, float, str]:
        """``(exit code, the time it exited, the output)``."""
        try:
            code = self.process.wait(timeout)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
        ended = time.time()
        self._reader.join(30)
        return code, ended, "".join(line for _, line in self.lines)

    def time_of(self, text: str) -> float:
        return next(at for at, line in self.lines if text in line)

    def timeline(self, origin: float) -> str:
        """The last lines, each with its time in seconds after ``origin``."""
        return "".join(f"{at - origin:+7.1f} s  {line}" for at, line in self.lines[-40:])


def two_process_command(server, output_dir: Path, model_dir: str, timeout: int) -> list[str]:
    """The launcher's training command on two CPU processes (cpu_2proc.yaml; a free rendezvous port)."""
    command = [
        *train_command(server, "riskpo", output_dir),
        "--model_name_or_path",
        model_dir,
        "--vllm_generation_timeout",
        str(timeout),
        "--vllm_sync_timeout",
        str(timeout),
    ]
    command[command.index("--config_file") + 1] = "recipes/accelerate_configs/cpu_2proc.yaml"
    command[command.index("--num_processes") + 1] = "2"
    launch = command.index("launch")
    return [*command[: launch + 1], "--main_process_port", "0", *command[launch + 1 :]]


def readiness(client) -> set[str]:
    return {state["weights"] for state in client.server_state()}


def test_a_sync_that_breaks_off_is_aborted_on_the_server_which_generates_and_takes_the_next_full_sync(
    server, model_dir
):
    """A sync whose trainer stops sending halfway (its transfer timeout passes on the server): the server aborts it,
    reports its weights as partial (never synced while half-reloaded), still generates for another client (no
    parameter left on the meta device), and the next trainer's full sync lands and passes the checks. The trainer's
    error says no restart is needed."""
    from riskpo_trl.weight_sync.bounded import WeightSyncError

    client = gloo_client(server, sync_timeout_s=5)
    model = load_model(model_dir)
    sync(client, model)
    assert readiness(client) == {"synced"}
    identity = client.identity
    with torch.no_grad():
        change_linear(model, torch.Generator().manual_seed(2))

    def half_then_silence(update_info, named_params):
        from concurrent.futures import ThreadPoolExecutor

        from riskpo_trl.weight_sync.gloo import broadcast_from_trainer

        with ThreadPoolExecutor(max_workers=1) as pool:
            received = pool.submit(client.control, "POST", "/update_weights", 60, json={"update_info": update_info})
            for index, (_, tensor) in enumerate(named_params):
                if index == len(update_info["names"]) // 2:
                    break
                broadcast_from_trainer(client.communicator, tensor, 5)
            with pytest.raises(WeightSyncError, match="update_weights with 500"):  # the server's transfer timeout
                received.result()

    client._transfer = half_then_silence
    with pytest.raises(WeightSyncError, match="finish_weight_update"):  # the server ended the sync itself
        client.update_named_params(
            [(name, "float32", list(param.shape)) for name, param in model.named_parameters()],
            ((name, param.data) for name, param in model.named_parameters()),
        )
    client.__dict__.pop("_transfer", None)
    assert readiness(client) == {"partial"}
    assert client.server_identity() == identity  # the same processes: the server survived
    assert plain_client(server).generate([[1, 2, 3]], max_tokens=4)["completion_ids"]
    assert "no restart needed" in str(client.with_server_state(WeightSyncError("A sync broke off.")))

    fresh = gloo_client(server)
    sync(fresh, model)  # checked: every parameter as sent
    assert_probe(fresh, model, passes=True)
    assert readiness(fresh) == {"synced"}


def test_a_second_trainer_on_a_busy_server_is_one_error_line_and_the_first_trains_on(
    server, model_dir, tmp_path, capsys, monkeypatch
):
    """While a trainer owns the server (its group port answers), a second one's start-up is one `error:` line naming
    the first's address and group port; the first then syncs and is checked as before."""
    from riskpo_trl.weight_sync import gloo_client as gloo_client_module

    first = gloo_client(server)
    model = load_model(model_dir)
    sync(first, model)
    # Another trainer: another process, as the server sees it.
    monkeypatch.setattr(gloo_client_module, "this_trainer", lambda: "second-host pid 1")
    line, _ = one_error_line(server["train"]["riskpo"], tmp_path, capsys)
    assert "already syncs weights with another trainer" in line, line
    assert f"group port {first.group_port}" in line and "One trainer per server" in line
    monkeypatch.undo()
    with torch.no_grad():
        change_norm(model, None)
    sync(first, model)
    assert_probe(first, model, passes=True)


def test_a_server_context_shorter_than_prompt_plus_completion_is_one_error_line(server, tmp_path, capsys):
    """The server's max_model_len (the tiny model's 512) against the longest prompt plus max_completion_length."""
    command = [*server["train"]["riskpo"], "--max_completion_length", "600"]
    line, _ = one_error_line(command, tmp_path, capsys)
    assert "takes at most 512 tokens per sequence (max_model_len)" in line, line
    assert "max_completion_length is 600" in line and "--max_model_len" in line


def test_trl_s_own_client_path_runs_the_same_checks_with_its_communicator_replaced_by_gloo(
    server, model_dir, monkeypatch
):
    """The checks on TRL's NCCL client path (`CheckedVLLMClient`: TRL's ``update_named_params`` with this package's
    start, finish and checks), on CPU. The test replaces TRL's NCCL communicator with a gloo group to the CPU
    server's engine, and TRL's NCCL broadcast of the packed tensors with gloo broadcasts: NCCL itself is not
    exercised here (tests/test_gpu_weight_sync.py does that on a GPU with vLLM's CUDA build). A sync lands and
    passes; with the broadcast suppressed, the check names the stale parameter."""
    import trl.generation.vllm_client as trl_vllm_client

    from riskpo_trl.weight_sync.bounded import SyncSettings, WeightSyncError
    from riskpo_trl.weight_sync.gloo import broadcast_from_trainer
    from riskpo_trl.weight_sync.trl_client import CheckedVLLMClient

    transport = gloo_client(server)  # only its group: TRL's client sends over it
    sent = []

    def gloo_producer(iterator, group, src, post_iter_func):
        for item in iterator:
            sent.append(item[0])
            broadcast_from_trainer(group, post_iter_func(item))

    monkeypatch.setattr(trl_vllm_client, "packed_nccl_broadcast_producer", gloo_producer)
    client = CheckedVLLMClient(base_url=server["url"], group_port=transport.group_port, connection_timeout=60)
    client.settings = SyncSettings(check_every=1)
    client.read_server_config()
    client.communicator = transport.communicator
    client.identity = client.extension_identity()
    assert client.identity == transport.identity

    model = load_model(model_dir)
    with torch.no_grad():
        change_linear(model, torch.Generator().manual_seed(3))
    client.update_model_params(model)  # TRL's own: metadata, update_named_params, start, broadcast, finish
    client.reset_prefix_cache()
    assert sent == [name for name, _ in model.named_parameters()]
    assert_probe(client, model, passes=True)

    with torch.no_grad():
        change_linear(model, torch.Generator().manual_seed(4))
    monkeypatch.setattr(trl_vllm_client, "packed_nccl_broadcast_producer", lambda iterator, **kwargs: list(iterator))
    post = client._post
    monkeypatch.setattr(
        client, "_post", lambda url, **kwargs: {} if url.endswith("/update_weights") else post(url, **kwargs)
    )
    with pytest.raises(
        WeightSyncError, match=r"qkv_proj\.weight on worker 0 \(as model\.layers\.0\.self_attn\.q_proj"
    ):
        client.update_model_params(model)
    assert_probe(client, model, passes=False)


def test_a_sync_its_trainer_left_unfinished_is_aborted_by_the_next_trainer_s_set_up(server, model_dir):
    """A trainer that started an update and died before finishing it leaves the server mid-reload (every layer on
    the meta device, generation would crash it): the next trainer's set-up aborts it, and its sync lands."""
    first = gloo_client(server)
    first.control("POST", "/start_weight_update", json={})
    assert readiness(first) == {"updating"}
    second = gloo_client(server)  # the set-up aborts the unfinished update
    assert readiness(second) == {"partial"}
    assert plain_client(server).generate([[1, 2, 3]], max_tokens=4)["completion_ids"]
    model = load_model(model_dir)
    sync(second, model)
    assert_probe(second, model, passes=True)
    assert readiness(second) == {"synced"}


def test_generation_by_another_client_during_syncs_is_refused_and_an_abandoned_sync_is_aborted_by_the_server(
    server, model_dir
):
    """Another client generates every 0.1 s while a trainer syncs (each sync checked) and then leaves a sync
    unfinished (started, never finished): every answer is a completion or a 503 refusal, never a crash; the server
    keeps its processes, the syncs pass their checks, and once the trainer's transfer timeout (5 s) has passed
    without a sync request, the server aborts the abandoned sync itself (readiness ``partial``) and generates
    again."""
    import requests

    client = gloo_client(server, sync_timeout_s=5)
    model = load_model(model_dir)
    identity, answers, done = client.identity, [], threading.Event()

    def generate_every_tenth_of_a_second():
        while not done.is_set():
            try:
                answer = requests.post(
                    f"{server['url']}/v1/completions",
                    json={"model": model_dir, "prompt": [[1, 2, 3]], "max_tokens": 2},
                    timeout=60,
                )
                answers.append((time.monotonic(), answer.status_code, answer.text[:300]))
            except requests.RequestException as error:
                answers.append((time.monotonic(), None, repr(error)))
            time.sleep(0.1)

    other = threading.Thread(target=generate_every_tenth_of_a_second, daemon=True)
    other.start()
    try:
        for seed in range(3):
            with torch.no_grad():
                change_linear(model, torch.Generator().manual_seed(10 + seed))
            sync(client, model)  # checked: the other client's requests changed nothing the trainer sent
        client.control("POST", "/start_weight_update", json={})  # and the trainer goes silent
        abandoned = time.monotonic()
        deadline = abandoned + 60
        while not any(at > abandoned + 5 and status == 200 for at, status, _ in answers):
            assert time.monotonic() < deadline and other.is_alive(), answers[-5:]
            time.sleep(0.2)
    finally:
        done.set()
        other.join(60)
    statuses = {status for _, status, _ in answers}
    assert statuses <= {200, 503}, [answer for answer in answers if answer[1] not in (200, 503)][:3]
    assert any(status == 503 and at > abandoned for at, status, _ in answers), answers[-20:]
    assert all("weights are being replaced" in text for _, status, text in answers if status == 503)
    assert client.server_identity() == identity  # the same processes: the server lived
    assert readiness(client) == {"partial"}
    print(f"{len(answers)} requests from the other client, {sum(status == 503 for _, status, _ in answers)} refused")
    fresh = gloo_client(server)
    sync(fresh, model)
    assert_probe(fresh, model, passes=True)


def test_a_server_that_drops_the_connection_is_one_error_naming_server_and_request():
    """A server killed while the trainer waits (its socket closes): `ServerUnreachableError`, which the training
    script turns into a stop at a checkpoint (exit 75), naming the server and the request. No vLLM needed."""
    from riskpo_trl.weight_sync.bounded import ServerUnreachableError

    with HangingServer(close=True) as server:
        client = bounded_client(server.url, generation_timeout_s=5.0)
        with pytest.raises(
            ServerUnreachableError,
            match=rf"{server.url} did not answer /v1/completions \(generation\): the connection was refused or "
            "dropped",
        ):
            client.generate([[1, 2]], n=2, max_tokens=4)
        with pytest.raises(ServerUnreachableError, match=r"/start_weight_update \(a weight-sync request\)"):
            bounded_client(server.url).control("POST", "/start_weight_update", json={})


class ResetOnce:
    """A session whose first request meets a connection the server had closed (or ``error``), then answers."""

    def __init__(self, error=None):
        import requests

        self.error = error or requests.ConnectionError("Connection aborted: reset by peer")
        self.requests, self.closed = 0, 0

    def request(self, method, url, timeout=None, **kwargs):
        self.requests += 1
        if self.requests == 1:
            raise self.error
        return SimpleNamespace(status_code=200, content=b"{}", json=lambda: {"results": ["ok"]})

    def close(self):
        self.closed += 1


def test_only_a_read_only_query_is_sent_again_after_a_reset_and_never_after_a_timeout():
    import requests

    from riskpo_trl.weight_sync.bounded import BoundedRequestsMixin, WeightSyncError

    def client(session):
        bounded = BoundedRequestsMixin.__new__(BoundedRequestsMixin)
        bounded.base_url, bounded._control_session = "http://server", session
        return bounded

    session = ResetOnce()
    assert client(session).control("POST", "/collective_rpc", 5, read_only=True) == {"results": ["ok"]}
    assert (session.requests, session.closed) == (2, 1)
    session = ResetOnce()
    with pytest.raises(WeightSyncError, match="did not answer /update_weights"):  # a sync's request runs once
        client(session).control("POST", "/update_weights", 5)
    assert session.requests == 1
    session = ResetOnce(requests.ConnectTimeout("connect timed out"))
    with pytest.raises(WeightSyncError, match="within 5 s"):
        client(session).control("POST", "/collective_rpc", 5, read_only=True)
    assert session.requests == 1


def test_two_processes_stop_together_on_a_hang_or_a_killed_server_exit_soon_after_their_stop_line_and_resume(
    server, model_dir, tmp_path
):
    """Two training processes under accelerate (the launcher's command, cpu_2proc.yaml), the server stopped (SIGSTOP)
    by a test hook of the main process, each run resuming the last:

    1. right after the identity check before the generation at step 1: both processes end within the generation
       timeout plus a bound, the main one with the error naming the server, the request and the step and the stop
       line, the other with its own line, one checkpoint and exit code 75 (torchrun turns it into 1; the stop file
       carries it);
    2. as the first tensor of the sync before step 2 leaves, on two processes resumed from a checkpoint (the
       optimizer state loads on CPU), then SIGTERM to the launcher: the run stops at once, long before the timeout
       (`Stopped by SIGTERM`), the same way.

    After SIGCONT a last run finishes, and the server holds the last sync's weights. Then a new run's generation at
    step 1 meets the server stopped and, a second later, killed (SIGKILL): both processes stop at once, the same way
    (`Stopped by a vLLM server that stopped answering`, the error naming the dropped connection).

    Each process exits within seconds of its stop line: an abandoned request's thread does not hold it, nor the group
    of a sync the SIGTERM cut short, freed by a full garbage collection as each stop ends (the test hook). Last in
    the module: it kills the module's server. (A sync's timeout on two processes: test_weight_sync_agreement.py,
    with a stand-in server; on one: test_a_server_that_hangs_stops_training_at_a_checkpoint_with_exit_75...)"""
    timeout = 25
    output_dir = tmp_path / "run"
    command = two_process_command(server, output_dir, model_dir, timeout)
    record, stop_file = tmp_path / "stopped-at", tmp_path / "stop-line"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "trainer_faults"), str(ROOT)]),
        "RISKPO_STOP_FILE": str(stop_file),
        "RISKPO_TEST_STOP_RECORD": str(record),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",  # each line's time is when it was written
    }
    group = os.getpgid(server["process"].pid)
    causes = {
        None: "a vLLM server timeout",
        signal.SIGTERM: "SIGTERM",
        signal.SIGKILL: "a vLLM server that stopped answering",  # to the server
    }

    def stop_once(output_dir: Path, where: str, step: int, then: int | None = None, to_server: bool = False):
        """A run in ``output_dir`` whose main process stops the server at ``where`` before step ``step`` (at the
        run's second sync), then ``then`` (if any) to the launcher, or to the server, 1 s later."""
        record.unlink(missing_ok=True)
        stop_file.unlink(missing_ok=True)
        command = two_process_command(server, output_dir, model_dir, timeout)
        run = TimedRun(command, {**env, "RISKPO_TEST_STOP_SERVER": f"{group}:{where}:2"})
        try:
            if then is not None:
                while not record.is_file() and run.process.poll() is None:
                    time.sleep(0.1)
                time.sleep(1)  # the main process is in its wait on the stopped server
                if to_server:
                    os.killpg(group, then)
                else:
                    run.process.send_signal(then)
                signalled = time.time()
            code, ended, output = run.finish()
        finally:
            if not to_server:
                stop_server(server, signal.SIGCONT)
        assert record.is_file(), f"the server was never stopped (exit code {code}):\n{output[-4000:]}"
        stopped = float(record.read_text().split()[0])
        assert code == 1 and stop_file.is_file(), output[-4000:]
        cause = causes[then]
        line = f"Stopped by {cause} at step {step} of {STEPS}: saved"
        assert line in stop_file.read_text() and output.count(line) == 1, output[-4000:]
        assert output.count(f"Process 1 of 2: stopped with the main process at step {step}") == 1, output[-4000:]
        named = (
            f"Generation by {server['url']} at step {step}: "
            if where == "generation"
            else f"Weight sync to {server['url']} before the generation at step {step}: "
        )
        assert output.count(named) == (then != signal.SIGTERM), output[-4000:]
        assert (then == signal.SIGKILL) == ("the connection was refused or dropped" in output), output[-4000:]
        assert "Traceback" not in output.split(line)[0], output[-4000:]  # torchrun reports the exit 75 after it
        assert (output_dir / f"checkpoint-{step}" / "trainer_state.json").is_file()
        assert ended - stopped < 2 * timeout + 60, ended - stopped
        after_line = ended - run.time_of(line)
        # The stop line, then the exit: each process within 5 s of its line (7 s where no Python thread can run),
        # the rest is torchrun's.
        assert after_line < 15, run.timeline(run.time_of(line))
        if then is not None:
            assert ended - signalled < timeout - 5, ended - signalled  # the signal ended it, not the timeout
        print(
            f"{where} ({cause}): ended {ended - stopped:.1f} s after the fault, {after_line:.1f} s after the stop line"
        )

    stop_once(output_dir, "generation", 1)
    stop_once(output_dir, "sync", 2, signal.SIGTERM)
    code, _, output = TimedRun(command, env).finish()
    assert code == 0 and "Resuming from" in output, output[-4000:]
    assert (output_dir / f"checkpoint-{STEPS}").is_dir()
    seqs = sequences(model_dir)
    served = server_logprobs(plain_client(server), seqs)
    assert largest_gap(served, model_logprobs(output_dir / f"checkpoint-{STEPS - 1}", seqs)) < LOGPROB_TOLERANCE

    server["killed by"] = "test_two_processes_stop_together_on_a_hang_or_a_killed_server"
    stop_once(tmp_path / "killed", "generation", 1, signal.SIGKILL, to_server=True)
