"""What a run needs besides its options, checked at start-up as one ``error:`` line before any model loads: vLLM for
``use_vllm``, the ``report_to`` loggers, the Hub for ``push_to_hub`` and for riskpo-eval's Hub models and benchmarks
(asked once; HF_HUB_OFFLINE honoured), unchanged risk settings on resume, and a recipe's paths from any directory."""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import datasets
import pytest
from helpers import tiny_config
from huggingface_hub import constants
from test_start_up_errors import run_cli  # the single 'error:' line, exit code 2, no traceback

from riskpo_trl import hub_access
from riskpo_trl.scripts import eval as eval_script
from riskpo_trl.scripts import train
from riskpo_trl.trainer.checkpoints import RISK_STATE_FILE, check_resume_settings

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_DATA = ROOT / "examples/data/tiny_arithmetic.jsonl"


def tiny_argv(tmp_path: Path, model_dir: str, *overrides: str) -> list[str]:
    return [
        "--config",
        str(TINY_RECIPE),
        "--model_name_or_path",
        model_dir,
        "--output_dir",
        str(tmp_path / "run"),
        "--dataset_files",
        str(TINY_DATA),
        "--max_completion_length",
        "8",
        *overrides,
    ]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the script gets as far as building the trainer (and so loading the model)."""

    def build_trainer(*args, **kwargs):
        raise AssertionError("the model was about to load")

    monkeypatch.setattr(train, "build_trainer", build_trainer)


@pytest.fixture
def hub(monkeypatch):
    """The Hub as the test sets it: online unless told, at an endpoint of the test's choosing, asked afresh."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_access.hub_unreachable.cache_clear()
    yield monkeypatch
    hub_access.hub_unreachable.cache_clear()


class ConnectionCounter:
    """A local endpoint that counts connections: ``answer`` True answers HEAD with 200, else it closes at once
    (a Hub that cannot be reached)."""

    def __init__(self, answer: bool):
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def handle(self):
                counter.connections += 1
                if answer:
                    super().handle()
                else:
                    self.connection.close()

            def do_HEAD(self):
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.connections = 0
        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def endpoint(hub):
    servers = []

    def start(answer: bool) -> ConnectionCounter:
        server = ConnectionCounter(answer)
        servers.append(server)
        hub.setattr(constants, "ENDPOINT", server.url)
        hub.setattr(datasets.config, "HF_ENDPOINT", server.url)
        hub.setenv("HF_ENDPOINT", server.url)
        return server

    yield start
    for server in servers:
        server.close()


# --- optional packages and the Hub for riskpo-train


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_use_vllm_without_vllm_is_one_line_before_the_model_loads(tmp_path, capsys, no_model_load):
    line = run_cli(train.cli, tiny_argv(tmp_path, str(tmp_path / "tiny"), "--use_vllm", "true"), capsys)
    assert line == (
        "riskpo-train: error: use_vllm is true but vLLM is not installed: pip install 'riskpo-trl[vllm]' "
        "(the tested vLLM range), or set use_vllm false to generate with transformers."
    )
    assert not (tmp_path / "tiny").exists()


@pytest.mark.parametrize("logger", ["tensorboard", "wandb"])
def test_a_report_to_logger_not_installed_is_one_line(tmp_path, capsys, no_model_load, logger):
    if importlib.util.find_spec(logger) is not None:
        pytest.skip(f"{logger} is installed here")
    line = run_cli(train.cli, tiny_argv(tmp_path, str(tmp_path / "tiny"), "--report_to", logger), capsys)
    assert line.startswith(
        f"riskpo-train: error: report_to includes '{logger}', which is not installed: pip install "
        f"{logger}, or leave it out of report_to"
    )


def test_push_to_hub_offline_is_one_line_before_training(tmp_path, capsys, no_model_load, hub):
    hub.setattr(constants, "HF_HUB_OFFLINE", True)
    line = run_cli(train.cli, tiny_argv(tmp_path, str(tmp_path / "tiny"), "--push_to_hub", "true"), capsys)
    assert line.startswith(
        "riskpo-train: error: push_to_hub is true but the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is set)"
    )


def test_push_to_hub_with_the_hub_unreachable_or_no_token_is_one_line(tmp_path, capsys, no_model_load, endpoint, hub):
    unreachable = endpoint(answer=False)
    line = run_cli(train.cli, tiny_argv(tmp_path, str(tmp_path / "tiny"), "--push_to_hub", "true"), capsys)
    assert f"push_to_hub is true but the Hugging Face Hub cannot be reached ({unreachable.url} did not answer" in line
    hub_access.hub_unreachable.cache_clear()
    endpoint(answer=True)
    hub.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored token
    hub.delenv("HF_TOKEN", raising=False)
    hub.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
    hub.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
    line = run_cli(train.cli, tiny_argv(tmp_path, str(tmp_path / "tiny"), "--push_to_hub", "true"), capsys)
    assert "push_to_hub is true but no Hugging Face token is found: run `hf auth login`" in line


# --- riskpo-eval without the Hub


def test_eval_asks_the_hub_once_then_fails_at_once_on_a_benchmark_not_cached(
    tmp_path, capsys, endpoint, hub, tiny_model_dir
):
    hub.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    server = endpoint(answer=False)
    line = run_cli(
        eval_script.cli,
        ["--model", tiny_model_dir, "--benchmarks", "math500", "--output_dir", str(tmp_path / "eval")],
        capsys,
    )
    assert "'math500' (HuggingFaceH4/MATH-500 on the Hugging Face Hub) is not available offline" in line
    assert server.connections == 1  # the probe; the libraries then ran offline, without retrying
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_eval_honours_hf_hub_offline_without_a_request(tmp_path, capsys, endpoint, hub, tiny_model_dir):
    hub.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    server = endpoint(answer=True)
    hub.setattr(constants, "HF_HUB_OFFLINE", True)
    hub.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    line = run_cli(
        eval_script.cli,
        ["--model", tiny_model_dir, "--benchmarks", "math500", "--output_dir", str(tmp_path / "eval")],
        capsys,
    )
    assert "is not available offline" in line and server.connections == 0


@pytest.mark.parametrize("model", ["outputs/no-such-model", "someone/no-such-model"])
def test_eval_names_a_model_that_exists_nowhere_locally_as_missing(tmp_path, capsys, endpoint, hub, model):
    hub.chdir(tmp_path)  # no outputs/ here: the name reads as a Hub id as much as a path
    hub.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    endpoint(answer=False)
    line = run_cli(eval_script.cli, ["--model", model, "--benchmarks", "math500"], capsys)
    assert line.startswith(
        f"riskpo-eval: error: model {model!r}: no such local directory, and not in the local Hub "
        "cache; the Hugging Face Hub cannot be reached"
    )


# --- resuming with other risk settings


@pytest.fixture(scope="module")
def one_step_checkpoint(tmp_path_factory, tiny_model_dir):
    tmp_path = tmp_path_factory.mktemp("resume-settings")
    train.main(*train.parse_args(tiny_argv(tmp_path, tiny_model_dir, "--max_steps", "1", "--save_steps", "1")))
    return tmp_path


def test_a_checkpoint_records_its_risk_settings(one_step_checkpoint):
    state = json.loads((one_step_checkpoint / "run" / "checkpoint-1" / RISK_STATE_FILE).read_text())
    assert state["settings"]["bundle_size"] == 2 and state["settings"]["risk_alpha"] == 0.2
    assert "quantile_lr" not in state["settings"]  # may change on resume


@pytest.mark.parametrize(
    ("flag", "value", "was"),
    [("bundle_size", "1", "2"), ("risk_alpha", "0.1", "0.2"), ("risk_profile", "rvar", "'mvar'")],
)
def test_resuming_with_changed_risk_settings_is_one_line_before_the_model_loads(
    one_step_checkpoint, tiny_model_dir, capsys, no_model_load, flag, value, was
):
    argv = tiny_argv(one_step_checkpoint, tiny_model_dir, "--max_steps", "2", f"--{flag}", value)
    line = run_cli(train.cli, argv, capsys)
    assert line.startswith(
        f"riskpo-train: error: {one_step_checkpoint / 'run' / 'checkpoint-1'} was trained with "
        f"{flag}={was}; this run sets {flag}="
    )


def test_a_legacy_checkpoint_is_checked_on_its_trackers_levels(tmp_path):

    (tmp_path / RISK_STATE_FILE).write_text(json.dumps({"quantile_tracker": {"levels": [0.2, 0.8]}}))
    args = tiny_config(tmp_path, run=False, use_cpu=True, risk_beta=0.9, report_to="none")
    with pytest.raises(ValueError, match=r"was trained with risk_beta=0.8; this run sets risk_beta=0.9"):
        check_resume_settings(str(tmp_path), args)
    check_resume_settings(
        str(tmp_path),
        tiny_config(tmp_path, run=False, use_cpu=True, report_to="none", quantile_lr=0.05, bundle_size=1),
    )


# --- a recipe from another directory


def test_a_shipped_recipe_reads_its_data_from_its_repository_when_run_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script_args, training_args, model_args = train.parse_args(["--config", str(TINY_RECIPE)])
    assert script_args.dataset_files == [str(TINY_DATA)]
    assert training_args.output_dir == "outputs/tiny-riskpo-arithmetic"  # what the run writes stays here
    assert model_args.model_name_or_path in ("./outputs/tiny-qwen2", str(ROOT / "outputs/tiny-qwen2"))


def test_a_recipe_input_found_nowhere_is_one_line(tmp_path, capsys, monkeypatch):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(TINY_RECIPE.read_text().replace("examples/data/tiny_arithmetic.jsonl", "data/missing.jsonl"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    line = run_cli(train.cli, ["--config", str(recipe)], capsys)
    assert line == (
        f"riskpo-train: error: {recipe}: dataset_files: data/missing.jsonl: no such file here "
        f"({tmp_path / 'elsewhere'}) or in the recipe's repository ({tmp_path})."
    )
    assert not (tmp_path / "elsewhere" / "outputs").exists()  # nothing was built


def test_a_missing_recipe_names_the_closest_one(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    line = run_cli(train.cli, ["--config", "recipes/tiny/riskpo/config_tiny_arithmetc.yaml"], capsys)
    assert line == (
        "riskpo-train: error: Recipe recipes/tiny/riskpo/config_tiny_arithmetc.yaml: no such file (did "
        "you mean recipes/tiny/riskpo/config_tiny_arithmetic.yaml?)."
    )
    monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's recipes, by their full path
    line = run_cli(train.cli, ["--config", "recipes/tiny/grpo/config_tiny_arithmetc.yaml"], capsys)
    assert line.endswith(f"(did you mean {ROOT / 'recipes/tiny/grpo/config_tiny_arithmetic.yaml'}?).")
