"""What the weight sync's checks cost in vLLM server mode: measured on the tiny model against a real CPU server, and
computed for the Qwen2.5 0.5B, 1.5B and 7B shapes.

    python -m benchmarks.weight_sync_cost          # in the real-vLLM venv (.ci/vllm_real.sh builds it)

The script builds the tiny model of the real-vLLM tests, starts `trl vllm-serve` on it with this package's CPU engine
(``SERVER_ARGS``, eager), and times, ``--repeats`` times each: a sync without its check (the transfer), the check of
the held weights (the server reads each matrix through its matmul on ``SKETCH_COLUMNS`` one-hot rows), the log-prob
probe, and one identity check. It then trains RiskPO's tiny recipe for ``--steps`` steps against the server (in this
process, its checks at the default frequency) and reports the time per step. Every figure is a median, printed with
the load average (/proc/loadavg) read before and after it. The computed part needs no server: the multiply-adds and
the temporary memory of reading every matrix back through the identity (the earlier check) and through the sketch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Qwen2.5 shapes (config.json of each Instruct model): hidden, intermediate, layers, query heads, kv heads, head
# dimension, vocabulary, tied embeddings.
SHAPES = {
    "0.5B": (896, 4864, 24, 14, 2, 64, 151936, True),
    "1.5B": (1536, 8960, 28, 12, 2, 128, 151936, True),
    "7B": (3584, 18944, 28, 28, 4, 128, 152064, False),
}


def matrices(shape: tuple) -> list[tuple[int, int]]:
    """``(out, in)`` of every matrix vLLM multiplies with, the LM head included (a tied head is read too)."""
    hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, _ = shape
    per_layer = [
        (heads * head_dim, hidden),
        (kv_heads * head_dim, hidden),
        (kv_heads * head_dim, hidden),
        (hidden, heads * head_dim),
        (intermediate, hidden),
        (intermediate, hidden),
        (hidden, intermediate),
    ]
    return per_layer * layers + [(vocab, hidden)]


def computed_costs(columns: int) -> dict[str, dict[str, float]]:
    """Per sync and model: the read-back's FLOPs (2 per multiply-add) and its largest temporary in bytes: the float32
    product and the float64 copy the checksum sums."""
    costs = {}
    for name, shape in SHAPES.items():
        layers = matrices(shape)
        costs[name] = {
            "identity_flops": sum(2.0 * inputs * inputs * out for out, inputs in layers),
            "identity_temp_bytes": max(12.0 * inputs * out for out, inputs in layers),
            "sketch_flops": sum(2.0 * columns * inputs * out for out, inputs in layers),
            "sketch_temp_bytes": max(4.0 * inputs * columns + 12.0 * out * columns for out, inputs in layers),
        }
    return costs


def loadavg() -> str:
    path = Path("/proc/loadavg")
    return " ".join(path.read_text().split()[:3]) if path.exists() else "unknown"


def median_time(action, repeats: int) -> dict[str, object]:
    before = loadavg()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "runs": repeats, "load_before": before, "load_after": loadavg()}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(model_dir: str, port: int, log: Path) -> subprocess.Popen:
    from riskpo_trl.weight_sync import SERVER_ARGS

    command = ["trl", "vllm-serve", "--model", model_dir, "--port", str(port), "--enforce-eager", *SERVER_ARGS]
    with log.open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 900) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(2)
    sys.exit(f"the server was not healthy after {timeout} s")


def measure_pieces(url: str, model_dir: str, repeats: int) -> dict[str, object]:
    import torch
    from transformers import AutoModelForCausalLM
    from trl.generation.vllm_client import VLLMClient

    torch.set_num_threads(1)  # as the training script sets on a loaded CPU machine (scripts.cpu_threads)

    from riskpo_trl.weight_sync.bounded import SyncSettings
    from riskpo_trl.weight_sync.checksums import sketch
    from riskpo_trl.weight_sync.client import open_client
    from riskpo_trl.weight_sync.probe import check_probe, model_logprobs, probe_tokens

    client = open_client(VLLMClient, False, SyncSettings(check_every=10**9), base_url=url, group_port=free_port())
    client.init_communicator("cpu")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    metadata = [(name, "float32", list(param.shape)) for name, param in model.named_parameters()]

    def transfer() -> None:
        client.update_named_params(metadata, ((name, param.data) for name, param in model.named_parameters()))

    transfer()  # the first sync is checked; the timed ones are not (check_every)
    pieces = {"transfer": median_time(transfer, repeats)}
    client._seed = 1  # the seed the held-weights request sends; the trainer's sketches below use it too
    sent = {name: (list(param.shape), sketch(param.data, client._seed)) for name, param in model.named_parameters()}
    token_ids = probe_tokens(model.config.vocab_size)
    model_logprobs(model, token_ids)  # the first forward pass warms up
    pieces["held_weights_check"] = median_time(lambda: client.verify(sent), repeats)
    pieces["probe"] = median_time(lambda: check_probe(client, token_ids, model_logprobs(model, token_ids)), repeats)
    pieces["identity_check"] = median_time(lambda: client.check_identity("the benchmark"), repeats)
    pieces["parameters"] = sum(param.numel() for param in model.parameters())
    return pieces


def measure_steps(url: str, model_dir: str, steps: int, work: Path) -> dict[str, object]:
    """RiskPO's tiny recipe against the server, in this process, at the default check frequency: the time per step
    of the run's steps after the first (from trainer_state.json's log history)."""
    from riskpo_trl.scripts.train import cli

    port = url.rsplit(":", 1)[1]
    output_dir = work / "run"
    before = loadavg()
    cli(
        [
            "--config",
            "recipes/tiny/riskpo/config_tiny_arithmetic.yaml",
            "--model_name_or_path",
            model_dir,
            "--build_tiny_model",
            "false",
            "--use_vllm",
            "true",
            "--vllm_mode",
            "server",
            "--vllm_server_port",
            port,
            "--vllm_group_port",
            str(free_port()),
            "--max_steps",
            str(steps),
            "--save_strategy",
            "no",
            "--output_dir",
            str(output_dir),
        ]
    )
    state = json.loads((output_dir / "trainer_state.json").read_text())
    runtime = next(entry["train_runtime"] for entry in state["log_history"] if "train_runtime" in entry)
    return {"seconds_per_step": runtime / steps, "steps": steps, "load_before": before, "load_after": loadavg()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures to this JSON file")
    parser.add_argument("--url", help="a running CPU server (SERVER_ARGS) of --model, instead of starting one")
    parser.add_argument("--model", help="the tiny model that server serves (with --url)")
    args = parser.parse_args(argv)

    from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model
    from riskpo_trl.weight_sync.bounded import DEFAULT_CHECK_EVERY
    from riskpo_trl.weight_sync.checksums import SKETCH_COLUMNS

    work = Path(tempfile.mkdtemp(prefix="weight-sync-cost-"))
    if args.url:
        pieces = measure_pieces(args.url, args.model, args.repeats)
        steps = measure_steps(args.url, args.model, args.steps, work)
    else:
        model_dir = str(work / "tiny")
        build_tiny_model(model_dir, **VLLM_CPU_SIZES, initializer_range=0.2)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = start_server(model_dir, port, work / "server.log")
        try:
            wait_healthy(url, server, work / "server.log")
            pieces = measure_pieces(url, model_dir, args.repeats)
            steps = measure_steps(url, model_dir, args.steps, work)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    every = DEFAULT_CHECK_EVERY
    identity = pieces["identity_check"]["median_s"]
    checked = pieces["held_weights_check"]["median_s"] + pieces["probe"]["median_s"]
    per_step = 3 * identity + checked / every  # identity before and after generation, before the sync
    result = {
        "pieces": pieces,
        "steps": steps,
        "checks_per_step_at_default_frequency_s": per_step,
        "share_of_a_step": per_step / steps["seconds_per_step"],
        "check_every": every,
        "sketch_columns": SKETCH_COLUMNS,
        "computed": computed_costs(SKETCH_COLUMNS),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
