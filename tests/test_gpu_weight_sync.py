"""The weight sync's checks on TRL's NCCL path, for real: `trl vllm-serve` on a GPU with vLLM's CUDA build, NCCL
weight transfer and this package's worker extension, and `CheckedVLLMClient` sending from a second GPU.

Marked ``gpu`` (skipped without CUDA); skipped too without vLLM or with fewer than two GPUs (NCCL refuses two ranks
on one device). Not yet run by this project. The prepared GPU check runs it as
``python -m pytest -q -m gpu tests/test_gpu_weight_sync.py -p no:cacheprovider`` in an environment with vLLM's CUDA
build and TRL 1.16. Its CPU twin, with a gloo communicator in place of NCCL, is in tests/test_vllm_real_server.py.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest
import torch

from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model
from riskpo_trl.weight_sync import WORKER_EXTENSION

pytestmark = pytest.mark.gpu
START_TIMEOUT = 600


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def nccl_server(tmp_path_factory):
    pytest.importorskip("vllm")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: the server on one, the trainer's NCCL rank on the other")
    requests = pytest.importorskip("requests")

    model_dir = tmp_path_factory.mktemp("tiny-served")
    build_tiny_model(model_dir, **VLLM_CPU_SIZES, initializer_range=0.2)
    port = free_port()
    log = model_dir / "vllm-serve.log"
    command = ["trl", "vllm-serve", "--model", str(model_dir), "--port", str(port), "--enforce-eager"]
    command += ["--dtype", "float32", "--gpu_memory_utilization", "0.2", "--worker-extension-cls", WORKER_EXTENSION]
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if requests.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`{' '.join(command)}` did not become healthy:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield {"url": url, "model_dir": str(model_dir)}
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)


def test_trl_s_nccl_sync_is_checked_through_the_worker_extension(nccl_server, monkeypatch):
    """A sync over NCCL lands and passes the held-weights check and the probe; with the broadcast suppressed, the
    check names the stale parameter and the probe sees the gap."""
    import trl.generation.vllm_client as trl_vllm_client
    from transformers import AutoModelForCausalLM

    from riskpo_trl.weight_sync.bounded import SyncSettings, WeightSyncError
    from riskpo_trl.weight_sync.client import open_client
    from riskpo_trl.weight_sync.probe import check_probe, model_logprobs, probe_tokens
    from riskpo_trl.weight_sync.trl_client import CheckedVLLMClient

    client = open_client(
        trl_vllm_client.VLLMClient,
        True,
        SyncSettings(check_every=1),
        base_url=nccl_server["url"],
        group_port=free_port(),
        connection_timeout=60,
    )
    assert isinstance(client, CheckedVLLMClient)
    client.init_communicator(device=1)
    assert client.identity is not None
    model = AutoModelForCausalLM.from_pretrained(nccl_server["model_dir"], dtype=torch.float32).to("cuda:1")
    token_ids = probe_tokens(model.config.vocab_size)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("_proj.weight"):
                param.add_(0.05 * torch.randn_like(param))
    client.update_model_params(model)
    client.reset_prefix_cache()
    check_probe(client, token_ids, model_logprobs(model, token_ids))

    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.add_(0.05)
    monkeypatch.setattr(trl_vllm_client, "packed_nccl_broadcast_producer", lambda iterator, **kwargs: list(iterator))
    post = client._post
    monkeypatch.setattr(client, "_post", lambda url, **kwargs: {} if url.endswith("/update_weights") else post(url))
    with pytest.raises(
        WeightSyncError, match=r"qkv_proj\.weight on worker 0 \(as model\.layers\.0\.self_attn\.q_proj"
    ):
        client.update_model_params(model)
    with pytest.raises(WeightSyncError, match="largest gap"):
        check_probe(client, token_ids, model_logprobs(model, token_ids))
