"""The CPU weight sync of vLLM server mode, without vLLM: the checksums, the gloo transport between two ranks, which
client a trainer gets for which server, the check after an update, and the refusal on TRL releases before 1.16.
The real-vLLM suite (tests/test_vllm_real_server.py) runs it against `vllm serve`."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from riskpo_trl.compat import serving
from riskpo_trl.weight_sync import BACKEND, SERVER_ARGS, WORKER_EXTENSION
from riskpo_trl.weight_sync import client as sync_client
from riskpo_trl.weight_sync.bounded import SyncSettings
from riskpo_trl.weight_sync.checked import compare_held
from riskpo_trl.weight_sync.checksums import checksum, same_checksum
from riskpo_trl.weight_sync.gloo import address_towards, broadcast_from_trainer, open_group

TRL_1_16 = serving.trl_serves_weight_transfer_engines()


def test_checksums_tell_the_sent_tensor_from_a_stale_zeroed_or_permuted_one():
    sent = torch.randn(64, 16)
    assert same_checksum(checksum(sent), checksum(sent.clone()))
    assert same_checksum(checksum(sent), checksum(sent.to(torch.float64)))
    for other in (sent + 1e-3, torch.zeros_like(sent), sent.flip(0)):
        assert not same_checksum(checksum(sent), checksum(other))


def test_the_server_arguments_name_the_engine_and_its_extension():
    assert SERVER_ARGS[SERVER_ARGS.index("--weight-transfer-config.backend") + 1] == BACKEND
    assert SERVER_ARGS[SERVER_ARGS.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    assert SERVER_ARGS[SERVER_ARGS.index("--dtype") + 1] == "float32"
    module, _, name = WORKER_EXTENSION.rpartition(".")
    assert module == "riskpo_trl.weight_sync.server" and name == "GlooWeightSyncExtension"


def test_the_gloo_group_carries_tensors_from_the_trainer_to_a_worker():
    address = address_towards("127.0.0.1")
    assert address == "127.0.0.1"
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sent = torch.randn(5, 3)
    received = torch.empty(5, 3)
    errors = []

    def worker():
        try:
            broadcast_from_trainer(open_group(address, port, 1, 2, timeout_s=60), received)
        except Exception as error:  # reported by the assertion below
            errors.append(error)

    thread = threading.Thread(target=worker)
    thread.start()
    broadcast_from_trainer(open_group(address, port, 0, 2, timeout_s=60), sent)
    thread.join(60)
    assert not errors and torch.equal(received, sent)


def test_a_group_whose_peer_never_joins_or_never_receives_fails_instead_of_hanging():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RuntimeError, match="timeout"):  # the server's workers never join
        open_group("127.0.0.1", port, 0, 2, timeout_s=1)
    groups = {}
    joining = threading.Thread(target=lambda: groups.setdefault(1, open_group("127.0.0.1", port, 1, 2, 60)))
    joining.start()
    trainer = open_group("127.0.0.1", port, 0, 2, timeout_s=60)
    joining.join(60)
    with pytest.raises(RuntimeError, match="Timed out"):  # joined, but nothing receives
        broadcast_from_trainer(trainer, torch.ones(3), timeout_s=1)


def joined_pair(timeout_s: float = 60):
    """The trainer's end of a two-rank group whose other rank (a thread here) joins and never receives."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    peers = []
    joining = threading.Thread(target=lambda: peers.append(open_group("127.0.0.1", port, 1, 2, timeout_s)))
    joining.start()
    trainer = open_group("127.0.0.1", port, 0, 2, timeout_s=timeout_s)
    joining.join(timeout_s)
    return trainer, peers


def test_a_broadcast_a_stop_cuts_short_leaves_no_group_whose_release_waits_for_its_timeout():
    """A stop signal ends the main thread's wait while the broadcast goes on in gloo's thread. The group's destructor
    joins that thread, so freeing the stop's traceback (the garbage collector does, at any later point) would wait
    until the broadcast's timeout: the stop, and the exit after its line, held for the whole sync timeout."""
    import gc
    import os
    import signal
    import time

    from riskpo_trl.weight_sync.bounded import StopRequested, interrupt_wait, interruptible_wait

    trainer, peers = joined_pair()
    previous = signal.signal(signal.SIGUSR2, lambda *_: interrupt_wait("SIGTERM"))
    signalling = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR2))
    signalling.start()
    stopped = None
    try:
        with interruptible_wait():
            broadcast_from_trainer(trainer, torch.ones(3), timeout_s=20)
    except StopRequested as error:
        stopped = error
    finally:
        signalling.join()
        signal.signal(signal.SIGUSR2, previous)
    assert stopped is not None and stopped.signal_name == "SIGTERM"
    started = time.monotonic()
    del stopped, trainer  # the traceback's frames held the group and its pending broadcast
    gc.collect()
    assert time.monotonic() - started < 5
    peers.clear()


class FakeTRLClient:
    """Stands in for TRL's VLLMClient: answers /server_info with a given weight-transfer config."""

    def __init__(self, backend, **kwargs):
        self.base_url, self.kwargs, self.backend = "http://server:8000", kwargs, backend
        self.session = SimpleNamespace(close=lambda: None)

    def get_server_info(self):
        if self.backend == "no dev mode":
            raise RuntimeError("no development endpoints")
        return {"weight_transfer_config": None if self.backend is None else {"backend": self.backend}}


@pytest.fixture
def gloo_marker(monkeypatch):
    class GlooMarker:
        def __init__(self, *args, **kwargs):
            self.kwargs = kwargs

    class CheckedMarker(GlooMarker):
        pass

    monkeypatch.setattr(sync_client, "gloo_client_class", lambda: GlooMarker)
    monkeypatch.setattr(sync_client, "checked_client_class", lambda: CheckedMarker)
    monkeypatch.setattr(sync_client, "announce_wait", lambda *args, **kwargs: None)  # no server to ask
    return GlooMarker


def test_a_server_on_this_package_s_backend_gets_the_gloo_client(gloo_marker):
    client = sync_client.open_client(FakeTRLClient, False, SyncSettings(), BACKEND, group_port=5)
    assert isinstance(client, gloo_marker) and client.kwargs == {"group_port": 5}


@pytest.mark.parametrize("backend", [None, "no dev mode"])
def test_a_server_without_weight_transfer_gets_trl_s_client_which_reports_it(gloo_marker, backend):
    client = sync_client.open_client(FakeTRLClient, True, SyncSettings(), backend)
    assert type(client) is FakeTRLClient


def test_an_nccl_server_on_cuda_gets_trl_s_client_bounded_and_checked_with_the_settings(gloo_marker):
    settings = SyncSettings(check_every=3)
    client = sync_client.open_client(FakeTRLClient, True, settings, "nccl", group_port=5)
    assert type(client).__name__ == "CheckedMarker" and client.kwargs == {"group_port": 5}
    assert client.settings == settings


def test_a_cuda_only_backend_is_refused_on_a_trainer_without_cuda_naming_the_launcher_s_fix(gloo_marker):
    with pytest.raises(sync_client.ServerRefusedError, match="'nccl' engine, which needs CUDA") as error:
        sync_client.open_client(FakeTRLClient, False, SyncSettings(), "nccl")
    assert "--vllm-args" in str(error.value) and " ".join(SERVER_ARGS) in str(error.value)
    # A server without weight transfer, or without its development endpoints: TRL's client reports it.
    assert type(sync_client.open_client(FakeTRLClient, False, SyncSettings(), None)) is FakeTRLClient


def server_mode(**settings):
    return SimpleNamespace(**{"use_vllm": True, "vllm_mode": "server", "use_cpu": True, **settings})


@pytest.mark.parametrize("args", [server_mode(use_vllm=False), server_mode(vllm_mode="colocate"), SimpleNamespace()])
def test_the_hook_does_nothing_outside_server_mode(monkeypatch, args):
    monkeypatch.setattr(serving, "trl_vllm_generation_module", lambda: pytest.fail("looked at TRL's client"))
    with sync_client.serve_weights_to_cpu_servers(args):
        pass


def test_server_mode_without_cuda_is_refused_before_trl_1_16(monkeypatch):
    monkeypatch.setattr(serving, "trl_serves_weight_transfer_engines", lambda: False)
    with pytest.raises(ValueError, match="vLLM server mode without CUDA needs TRL 1.16"):
        with sync_client.serve_weights_to_cpu_servers(server_mode()):
            pass
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with sync_client.serve_weights_to_cpu_servers(server_mode(use_cpu=False)):  # TRL's own NCCL path on CUDA
        pass


@pytest.mark.skipif(not TRL_1_16, reason="TRL 1.16's server client")
def test_while_a_trainer_is_built_trl_opens_its_server_client_through_open_client():
    module = serving.trl_vllm_generation_module()
    original = module.VLLMClient
    with sync_client.serve_weights_to_cpu_servers(server_mode()):
        hooked = module.VLLMClient
        assert hooked.func is sync_client.open_client and hooked.args == (original, False, SyncSettings())
        with sync_client.serve_weights_to_cpu_servers(server_mode()):  # RiskPOTrainer inside the training script's
            assert module.VLLMClient is hooked
    assert module.VLLMClient is original


def held(name, tensor, held_as=None):
    return {
        "name": name,
        "held_as": held_as or name,
        "dtype": "float32",
        "shape": list(tensor.shape),
        "checksum": checksum(tensor),
    }


def test_compare_held_names_every_way_a_server_can_differ_from_what_was_sent():
    norm, embed = torch.randn(8), torch.randn(16, 8)
    sent = {"model.norm.weight": ([8], checksum(norm)), "model.embed_tokens.weight": ([16, 8], checksum(embed))}
    server = [
        held("model.norm.weight", norm),
        held("model.embed_tokens.weight", embed),
        held("model.embed_tokens.weight", embed, held_as="lm_head.weight"),
    ]
    assert compare_held(sent, [server]) == []

    stale_head = held("model.embed_tokens.weight", embed - 0.01, held_as="lm_head.weight")
    [problem] = compare_held(sent, [server[:2] + [stale_head]])
    assert problem.startswith("lm_head.weight on worker 0 (as model.embed_tokens.weight): checksum")
    [problem] = compare_held(sent, [server[1:]])
    assert problem == "model.norm.weight: worker 0 holds nothing under this name"
    unsent = held(
        "model.layers.0.mlp.gate_proj.weight", torch.ones(2, 2), held_as="model.layers.0.mlp.gate_up_proj.weight"
    )
    [problem] = compare_held(sent, [server + [unsent]])
    assert "gate_up_proj.weight on worker 0 (as model.layers.0.mlp.gate_proj.weight): no tensor" in problem
    [problem] = compare_held(sent, [server[:2] + [{**server[2], "checksum": None}]])
    assert "empty, and cannot be read back" in problem
    [problem] = compare_held(sent, [server[:2] + [{**server[2], "shape": [32, 8]}]])
    assert "shape [32, 8], sent [16, 8]" in problem
    assert len(compare_held(sent, [server, server[1:]])) == 1  # every worker is checked


class ProbedServer:
    base_url, server_dtype = "http://server:8000", "float32"

    def __init__(self, logprobs):
        self.logprobs = logprobs

    def probe_logprobs(self, token_ids):
        return self.logprobs


def test_the_probe_passes_the_same_log_probs_and_names_the_gap_of_others():
    from riskpo_trl.weight_sync.probe import PROBE_TOLERANCE, check_probe

    reference = [-1.0, -2.0, -3.0]
    check_probe(ProbedServer([-1.0, -2.0 + PROBE_TOLERANCE["float32"] / 2, -3.0]), [1, 2, 3, 4], reference)
    with pytest.raises(sync_client.WeightSyncError, match="largest gap 0.5 nats, tolerance 0.001 for float32"):
        check_probe(ProbedServer([-1.0, -2.5, -3.0]), [1, 2, 3, 4], reference)
    with pytest.raises(sync_client.WeightSyncError, match="largest gap nan"):
        check_probe(ProbedServer([-1.0, float("nan"), -3.0]), [1, 2, 3, 4], reference)


def test_a_server_of_another_dtype_than_the_model_is_refused_naming_the_flag():
    from riskpo_trl.weight_sync.probe import dtype_refusal

    model = torch.nn.Linear(2, 2)
    assert dtype_refusal(ProbedServer([]), model) is None
    server = ProbedServer([])
    server.server_dtype = "bfloat16"
    assert "runs in bfloat16 and the model trains in float32" in dtype_refusal(server, model)
    assert "--dtype float32" in dtype_refusal(server, model)


def test_probe_tokens_are_fixed_and_inside_the_vocabulary():
    from riskpo_trl.weight_sync.probe import PROBE_LENGTH, probe_tokens

    assert probe_tokens(100) == probe_tokens(100) and len(probe_tokens(100)) == PROBE_LENGTH
    assert all(0 <= token < 100 for token in probe_tokens(100)) and len(set(probe_tokens(100))) > 1


def test_a_server_that_does_not_answer_gets_a_waiting_line_at_once(capsys):
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sync_client.announce_wait(base_url=f"http://127.0.0.1:{port}", connection_timeout=240)
    assert capsys.readouterr().err == (
        f"Waiting up to 240 s for the vLLM server at http://127.0.0.1:{port} (vllm_server_timeout) ...\n"
    )


def test_a_vllm_without_the_weight_transfer_api_gets_one_error_naming_what_is_missing(monkeypatch):
    monkeypatch.setattr(serving, "VLLM_WEIGHT_TRANSFER", {"json": ("loads", "no_such_name"), "no_such_module": ("x",)})
    with pytest.raises(ImportError, match="lacks json.no_such_name, no_such_module. Install vllm==0.31.0"):
        serving.check_vllm_weight_transfer()


@pytest.mark.skipif(not TRL_1_16, reason="TRL 1.16's server client")
def test_trl_s_client_has_what_the_gloo_client_builds_on():
    import inspect

    client_class = serving.trl_vllm_client_class()
    assert serving.trl_vllm_generation_module().VLLMClient is client_class
    for name in (
        "_post",
        "_start_weight_update",
        "_finish_weight_update",
        "get_server_info",
        "get_world_size",
        "init_communicator",
        "reset_prefix_cache",
        "close_communicator",
        "weight_update",
    ):
        assert callable(getattr(client_class, name)), name
    assert list(inspect.signature(client_class.update_named_params).parameters) == ["self", "metadata", "named_params"]
    init = inspect.getsource(client_class.__init__)
    assert "self._updating_weights = False" in init and "self.session = " in init and "self.group_port" in init
    # VLLMGeneration syncs through update_named_params and builds its client as VLLMClient(base_url=..., ...).
    generation = inspect.getsource(serving.trl_vllm_generation_module().VLLMGeneration)
    assert "self.vllm_client.update_named_params(" in generation and "VLLMClient(" in generation


def test_a_sketch_reads_the_columns_the_seed_draws_the_same_on_both_sides():
    from riskpo_trl.weight_sync.checksums import SKETCH_COLUMNS, sketch, sketch_columns

    columns = sketch_columns(12345, 1000)
    assert columns == sketch_columns(12345, 1000) != sketch_columns(54321, 1000)
    assert len(set(columns)) == SKETCH_COLUMNS and all(0 <= column < 1000 for column in columns)
    assert sketch_columns(1, 5) == [0, 1, 2, 3, 4]  # a narrow matrix: every column
    matrix = torch.randn(16, 1000)
    assert sketch(matrix, 12345) == checksum(matrix[:, columns])
    vector = torch.randn(7)
    assert sketch(vector, 12345) == checksum(vector)
    # A change in a drawn column is seen; one outside them is not (the false pass the docs quantify).
    unseen = next(column for column in range(1000) if column not in columns)
    for column, seen in ((columns[0], True), (unseen, False)):
        changed = matrix.clone()
        changed[3, column] += 1.0
        assert same_checksum(sketch(matrix, 12345), sketch(changed, 12345)) is not seen


def test_a_generation_s_timeout_grows_with_the_batch_unless_set():
    from riskpo_trl.weight_sync.bounded import GENERATION_TIMEOUT_FLOOR_S, generation_timeout

    derived = SyncSettings()
    assert generation_timeout(derived, 2, 4, 16) == GENERATION_TIMEOUT_FLOOR_S + 1
    assert generation_timeout(derived, 480, 10, 3072) == GENERATION_TIMEOUT_FLOOR_S + 14746
    assert generation_timeout(SyncSettings(generation_timeout_s=42.0), 480, 10, 3072) == 42.0


class StatedServer:
    """A checked client's view of a server's readiness after a failed sync."""

    def __init__(self, states):
        self.states = states

    def control(self, method, path, timeout=None, json=None, **kwargs):
        if self.states is None:
            raise sync_client.ServerTimeoutError("did not answer /collective_rpc within 10 s")
        return {"results": [{"weights": state, "failure": "", "owner": None} for state in self.states]}


@pytest.mark.parametrize(
    ("states", "advice"),
    [
        (["partial"], "The server aborted the sync"),
        (["synced", "partial"], "The server aborted the sync"),
        (["broken"], "restart it."),
        (None, "The server does not answer now either"),
    ],
)
def test_a_failed_sync_s_error_says_whether_the_server_needs_a_restart(states, advice):
    from riskpo_trl.weight_sync.checked import CheckedClientMixin

    class Client(StatedServer, CheckedClientMixin):
        pass

    error = Client(states).with_server_state(sync_client.ServerTimeoutError("Transfer timed out."))
    assert type(error) is sync_client.ServerTimeoutError  # still stops the run at a checkpoint
    assert str(error).startswith("Transfer timed out. ") and advice in str(error)
    assert ("no restart needed" in str(error)) == (states is not None and "broken" not in states)


class TinyTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, return_dict, **kwargs):
        assert add_generation_prompt and tokenize and not return_dict
        return ["<turn>"] + [word for message in messages for word in message["content"].split()] + ["<gen>"]


def context_trainer(prompts, max_completion_length=10):
    from datasets import Dataset

    return SimpleNamespace(
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=TinyTokenizer(),
        args=SimpleNamespace(max_completion_length=max_completion_length, chat_template_kwargs=None),
    )


def test_a_server_context_shorter_than_the_longest_prompt_plus_completion_is_refused_naming_both():
    from riskpo_trl.weight_sync.context_length import context_refusal, longest_prompt_tokens

    chat = [[{"role": "user", "content": "a b c"}], [{"role": "user", "content": "a b c d e f"}]]
    assert longest_prompt_tokens(context_trainer(chat)) == 8
    assert longest_prompt_tokens(context_trainer(["one two", "one two three"])) == 3
    server = SimpleNamespace(base_url="http://server:8000", max_model_len=18)
    assert context_refusal(server, context_trainer(chat)) is None  # 8 + 10 fits exactly
    refusal = context_refusal(server, context_trainer(chat, max_completion_length=11))
    assert "takes at most 18 tokens per sequence (max_model_len), and this run needs 19" in refusal
    assert "longest prompt has 8 tokens and max_completion_length is 11" in refusal
    assert "--max_model_len 19" in refusal
    assert context_refusal(SimpleNamespace(max_model_len=None), context_trainer(chat, 11)) is None


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"vllm_sync_timeout": 0}, "vllm_sync_timeout=0 must be > 0"),
        ({"vllm_generation_timeout": -1.0}, "vllm_generation_timeout=-1.0 must be > 0"),
        ({"vllm_check_every": 0}, "vllm_check_every=0 must be >= 1"),
    ],
)
def test_bad_server_settings_are_refused_with_the_script_s_arguments(setting, message):
    from riskpo_trl.scripts.train import RiskPOScriptArguments

    with pytest.raises(ValueError, match=message):
        RiskPOScriptArguments(**setting)


def test_a_config_given_a_job_setting_names_where_it_goes_now(tmp_path):
    from riskpo_trl import RiskPOConfig

    with pytest.raises(
        TypeError,
        match=r"^vllm_sync_timeout is a setting of the training job, not of RiskPOConfig: "
        r"pass --vllm_sync_timeout to riskpo-train, or .*weight_sync=SyncSettings\(sync_timeout_s=",
    ):
        RiskPOConfig(str(tmp_path), vllm_sync_timeout=30.0)


class Built(Exception):
    """Raised by a stand-in for the job layer's build, with what it was given."""


@pytest.mark.parametrize("trainer", ["riskpo", "grpo"])
def test_every_trainer_s_job_gets_the_server_settings_of_its_command_line(
    trainer, tiny_model_dir, tmp_path, monkeypatch
):
    """The vllm_* settings are the job's, not a config's: riskpo-train takes them for a baseline as for RiskPO, and
    they reach the job layer's build (which hands them to the server client)."""
    from riskpo_trl.job import guard_rails
    from riskpo_trl.scripts import train

    def recording_build(trainer_class, **kwargs):
        raise Built(kwargs)

    monkeypatch.setattr(guard_rails, "build", recording_build)
    root = Path(__file__).resolve().parents[1]
    argv = ["--config", str(root / f"recipes/tiny/{trainer}/config_tiny_arithmetic.yaml")]
    argv += ["--model_name_or_path", tiny_model_dir, "--output_dir", str(tmp_path / "run")]
    argv += ["--dataset_files", str(root / "examples/data/tiny_arithmetic.jsonl")]
    argv += ["--vllm_generation_timeout", "30", "--vllm_sync_timeout", "20", "--vllm_check_every", "3"]
    with pytest.raises(Built) as built:
        train.build_trainer(*train.parse_args(argv))
    assert built.value.args[0]["weight_sync"] == SyncSettings(
        generation_timeout_s=30.0, sync_timeout_s=20.0, check_every=3
    )


def test_an_error_s_text_is_one_line_without_gloo_s_greeting_and_never_empty():
    """What the errors and the server's readiness quote of a library's exception: a future's timeout has no text of
    its own (its class stands in), and gloo ends some messages with a greeting that says nothing of the fault."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from riskpo_trl.weight_sync.bounded import error_text

    assert error_text(FutureTimeout()) == "TimeoutError"
    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer\n GLHF! 🏖️")
    assert error_text(gloo) == "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    assert error_text(ValueError("a\n  b")) == "a b"


def test_a_timeout_s_message_names_its_cause_even_without_text():
    from concurrent.futures import TimeoutError as FutureTimeout

    from riskpo_trl.weight_sync.bounded import BoundedRequestsMixin

    client = BoundedRequestsMixin.__new__(BoundedRequestsMixin)
    client.base_url = "http://server:8000"
    message = str(client.timed_out("/update_weights", "the end of a weight transfer", 30, FutureTimeout()))
    assert message.endswith("within 30 s: TimeoutError") and ":." not in message
