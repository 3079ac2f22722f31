"""The launch scripts' argument handling, through --dry-run (no GPU, vLLM or SLURM needed)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SINGLE_NODE = ROOT / "examples/launch/launch_single_node.sh"
SLURM = ROOT / "examples/launch/slurm_riskpo.sh"
RECIPE = "recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_dapo_math.yaml"


def launch(script, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def commands(output: str) -> dict[str, list[str]]:
    lines = dict(line.split(": ", 1) for line in output.splitlines() if ": " in line)
    return {name: shlex.split(lines[name]) for name in ("vllm", "train")}


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_single_node_splits_gpus_between_server_and_training():
    result = launch(
        SINGLE_NODE,
        "--dry-run",
        "--config",
        RECIPE,
        "--vllm-gpus",
        "0,1",
        "--train-gpus",
        "2,3,4,5,6,7",
        "--port",
        "8123",
        "--",
        "--gradient_accumulation_steps",
        "40",
    )
    assert result.returncode == 0, result.stderr
    cmd = commands(result.stdout)
    assert cmd["vllm"][:2] == ["env", "CUDA_VISIBLE_DEVICES=0,1"]
    assert flag(cmd["vllm"], "--model") == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"  # read from the recipe
    assert (flag(cmd["vllm"], "--tensor_parallel_size"), flag(cmd["vllm"], "--data_parallel_size")) == ("1", "2")
    assert cmd["train"][:2] == ["env", "CUDA_VISIBLE_DEVICES=2,3,4,5,6,7"]
    assert flag(cmd["train"], "--num_processes") == "6"
    assert flag(cmd["train"], "-m") == "riskpo_trl.scripts.train"  # the package's entry point, not a file path
    assert flag(cmd["train"], "--config_file") == "recipes/accelerate_configs/zero3.yaml"
    assert cmd["train"][2:5] == ["accelerate", "launch", "--quiet"]  # a start-up error is the script's line alone
    assert flag(cmd["train"], "--vllm_server_port") == "8123" and flag(cmd["vllm"], "--port") == "8123"
    assert cmd["train"][-2:] == ["--gradient_accumulation_steps", "40"]


def test_single_node_adds_vllm_args_to_the_server_command_split_like_a_shell():
    from riskpo_trl.weight_sync import SERVER_ARGS

    extra = '--max_model_len 4096 --weight-transfer-config \'{"backend": "riskpo_gloo"}\''
    result = launch(SINGLE_NODE, "--dry-run", "--config", RECIPE, "--train-gpus", "1", "--vllm-args", extra)
    assert result.returncode == 0, result.stderr
    cmd = commands(result.stdout)
    assert cmd["vllm"][-4:] == ["--max_model_len", "4096", "--weight-transfer-config", '{"backend": "riskpo_gloo"}']
    assert "--max_model_len" not in cmd["train"]
    result = launch(
        SINGLE_NODE, "--dry-run", "--config", RECIPE, "--train-gpus", "1", "--vllm-args", " ".join(SERVER_ARGS)
    )
    assert commands(result.stdout)["vllm"][-len(SERVER_ARGS) :] == list(SERVER_ARGS)
    plain = commands(launch(SINGLE_NODE, "--dry-run", "--config", RECIPE, "--train-gpus", "1").stdout)
    assert plain["vllm"][-2:] == ["--port", "8000"]  # no empty argument without --vllm-args


def served_arguments(tmp_path: Path, vllm_args: str) -> list[str]:
    """The arguments `trl vllm-serve` receives from the launcher (a stand-in `trl` records them, NUL-separated, and
    exits, so the launcher stops there)."""
    record = tmp_path / "argv"
    stub = tmp_path / "bin" / "trl"
    stub.parent.mkdir()
    stub.write_text(f"#!/usr/bin/env bash\nprintf '%s\\0' \"$@\" > {shlex.quote(str(record))}\nexit 1\n")
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        [
            "bash",
            str(SINGLE_NODE),
            "--config",
            RECIPE,
            "--train-gpus",
            "1",
            "--model",
            "m",
            "--port",
            "8123",
            "--vllm-args",
            vllm_args,
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "the vLLM server exited before becoming healthy" in result.stderr, result.stderr
    return record.read_bytes().decode().split("\0")[:-1]


def test_single_node_passes_a_multi_line_vllm_arg_as_one_argument(tmp_path):
    template = "{% for m in messages %}\n--not-an-option {{ m.content }}\n{% endfor %}"
    served = served_arguments(tmp_path, f"--max_model_len 4096 --chat-template {shlex.quote(template)}")
    assert served[:2] == ["vllm-serve", "--model"]
    assert served[-4:] == ["--max_model_len", "4096", "--chat-template", template]


@pytest.mark.parametrize("blank", ["", "   ", " \n\t "])
def test_single_node_passes_nothing_for_an_empty_or_blank_vllm_args(tmp_path, blank):
    served = served_arguments(tmp_path, blank)
    assert served[-2:] == ["--port", "8123"] and "" not in served


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--train-gpus", "1", "--vllm-args", "--dtype 'float32"], "--vllm-args: cannot split"),
        (["--vllm-gpus", "0,1", "--train-gpus", "1,2"], "GPU 1 is in both"),
        (["--vllm-gpus", "0,1,2", "--train-gpus", "3", "--tp", "2"], "tensor-parallel groups of 2"),
        (["--train-gpus", "1", "--accelerate-config", "nope.yaml"], "nope.yaml"),
        (["--vllm-gpus", "0"], "--train-gpus is required"),
        (["--train-gpus", "1", "--bogus"], "unknown option '--bogus'"),
    ],
)
def test_single_node_rejects_bad_arguments(args, message):
    result = launch(SINGLE_NODE, "--dry-run", "--config", RECIPE, *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_single_node_requires_an_existing_recipe():
    assert "is required" in launch(SINGLE_NODE, "--dry-run", "--train-gpus", "1").stderr
    assert "does not exist" in launch(SINGLE_NODE, "--dry-run", "--config", "x.yaml", "--train-gpus", "1").stderr


def test_slurm_uses_last_node_for_vllm_and_the_rest_for_zero3_training():
    result = launch(
        SLURM,
        "--dry-run",
        "--nodelist",
        "n1 n2 n3",
        "--config",
        RECIPE,
        "--tp",
        "2",
        "--",
        "--gradient_accumulation_steps",
        "15",
        "--steps_per_generation",
        "60",
    )
    assert result.returncode == 0, result.stderr
    cmd = commands(result.stdout)
    assert (flag(cmd["vllm"], "--tensor_parallel_size"), flag(cmd["vllm"], "--data_parallel_size")) == ("2", "4")
    train = cmd["train"]
    assert (flag(train, "--num_machines"), flag(train, "--num_processes")) == ("2", "16")
    assert flag(train, "--main_process_ip") == "n1" and flag(train, "--vllm_server_host") == "n3"
    assert flag(train, "--machine_rank") == "$SLURM_NODEID"  # expanded on each node by srun
    assert flag(train, "--config_file").endswith("zero3.yaml")
    assert train[-4:] == ["--gradient_accumulation_steps", "15", "--steps_per_generation", "60"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodelist", "n1"], "at least 2 nodes"),
        (["--nodelist", "n1 n2", "--tp", "3"], "not a multiple of --tp 3"),
        ([], "not inside a SLURM allocation"),
    ],
)
def test_slurm_rejects_bad_arguments(args, message, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    result = launch(SLURM, "--dry-run", "--config", RECIPE, *args)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("script", [SINGLE_NODE, SLURM])
def test_arrays_that_may_be_empty_are_expanded_safely_under_set_u(script):
    # bash < 4.4 (e.g. CentOS 7 clusters) treats "${arr[@]}" of an empty array as unbound under `set -u`; the guarded
    # form ${arr[@]+"${arr[@]}"} expands to nothing instead. Arrays initialised as `NAME=()` may stay empty.
    text = script.read_text()
    maybe_empty = re.findall(r"\b([A-Za-z_]\w*)=\(\)", text)
    assert "EXTRA" in maybe_empty
    for name in maybe_empty:
        unguarded = text.replace(f'${{{name}[@]+"${{{name}[@]}}"}}', "")
        assert f'"${{{name}[@]}}"' not in unguarded, f"{script.name}: guard every expansion of {name}"


def test_launchers_run_without_extra_arguments():
    single = launch(SINGLE_NODE, "--dry-run", "--config", RECIPE, "--vllm-gpus", "0", "--train-gpus", "1")
    assert single.returncode == 0, single.stderr
    assert commands(single.stdout)["train"][-2:] == ["--vllm_server_port", "8000"]
    slurm = launch(SLURM, "--dry-run", "--nodelist", "n1 n2", "--config", RECIPE)
    assert slurm.returncode == 0, slurm.stderr
    assert commands(slurm.stdout)["train"][-2:] == ["--vllm_server_port", "8000"]


STUB_SERVER = """#!/usr/bin/env python3
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Healthy).serve_forever()
"""
# A stand-in `accelerate launch`: training that ends as $1 says, as torchrun reports it (exit 1 for any failure).
STUB_TRAINING = """#!/usr/bin/env bash
case "$STUB_OUTCOME" in
  stopped) echo "Stopped by SIGTERM at step 4 of 10: saved out/checkpoint-4." > "$RISKPO_STOP_FILE"; exit 1 ;;
  crashed) exit 1 ;;
  signalled) trap 'echo "Stopped by SIGTERM at step 2 of 10" > "$RISKPO_STOP_FILE"; exit 1' TERM
             echo ready; while :; do sleep 0.1; done ;;
  *) exit 0 ;;
esac
"""


def run_single_node(tmp_path: Path, outcome: str, signal_after_ready: bool = False) -> tuple[int, str]:
    """launch_single_node.sh for real, with a stand-in `trl` (a server answering /health) and `accelerate`
    (training that ends as ``outcome`` says)."""
    import signal
    import socket

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("trl", STUB_SERVER), ("accelerate", STUB_TRAINING)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_OUTCOME": outcome, "TMPDIR": str(tmp_path)}
    command = ["bash", str(SINGLE_NODE), "--config", RECIPE, "--train-gpus", "1", "--model", "m", "--port", str(port)]
    launcher = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if signal_after_ready:
        for line in launcher.stdout:
            if line.strip() == "ready":
                break
        launcher.send_signal(signal.SIGTERM)
    output, _ = launcher.communicate(timeout=60)
    return launcher.returncode, output


@pytest.mark.parametrize(("outcome", "code"), [("stopped", 75), ("crashed", 1), ("finished", 0), ("signalled", 75)])
def test_single_node_exits_75_when_training_stopped_cleanly(tmp_path, outcome, code):
    """The training processes' stop line in $RISKPO_STOP_FILE turns the launcher's exit 1 into 75; a crash stays 1.
    A SIGTERM to the script reaches training, which stops cleanly. No stop file is left behind."""
    returncode, output = run_single_node(tmp_path, outcome, signal_after_ready=outcome == "signalled")
    assert returncode == code, output
    assert ("exit code 75 (the same command resumes)" in output) == (code == 75)
    assert not list(tmp_path.glob("riskpo-stop-*"))
