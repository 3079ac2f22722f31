"""riskpo-eval as a newcomer meets it: defaults in --help, a missing model path or an adapter directory as --model,
earlier samples in output_dir, results of local files labelled with the file, and its CPU thread count."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from riskpo_trl.evaluation import EvalConfig, evaluate
from riskpo_trl.scripts import eval as eval_script

ROOT = Path(__file__).resolve().parents[1]
TOY_ROWS = str(Path(__file__).parent / "data" / "toy_math.jsonl")
TOY_PROBLEMS = 5


class EchoBackend:
    """Answers every problem with ``\\boxed{5}``, without a model."""

    class _Tokenizer:
        chat_template = None

    tokenizer = _Tokenizer()

    def __init__(self):
        self.prompts_seen: list[str] = []

    def generate(self, prompts, settings, images=None):
        from riskpo_trl.evaluation import Sample

        self.prompts_seen += prompts
        return [[Sample("\\boxed{5}", num_tokens=4)] * settings.num_samples for _ in prompts]


def one_error_line(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        eval_script.cli(argv)
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    [line] = [line for line in err.splitlines() if "error:" in line]
    return line


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit):
        eval_script.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "Completions sampled per problem (n). (default: 8)" in text
    assert "Sampling temperature (0 = greedy). (default: 0.8)" in text
    assert re.search(r"--output_dir OUTPUT_DIR .*\(default: eval_results\)", text)
    assert "--model MODEL Model to evaluate" in text and "names. (default: None)" not in text  # required: no default


def test_a_missing_local_model_is_said_at_once(tmp_path, capsys):
    line = one_error_line(
        [
            "--model",
            str(tmp_path / "no-such-model"),
            "--dataset_files",
            TOY_ROWS,
            "--output_dir",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    assert f"model {str(tmp_path / 'no-such-model')!r}: no such directory, and not a Hub id" in line
    assert not (tmp_path / "out").exists()  # said before anything was written


PROBE = """
import sys
from riskpo_trl.scripts.eval import cli
try:
    cli(sys.argv[1:])
except SystemExit as exit:
    print("EXIT", exit.code, "torch" in sys.modules)
"""


def test_a_missing_relative_model_path_fails_before_torch_loads(tmp_path):
    (tmp_path / "outputs").mkdir()  # so `outputs/tiny-qwen2` reads as a local path, as riskpo-train reads it
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "--model", "outputs/tiny-qwen2", "--benchmarks", "math500"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.stdout.split() == ["EXIT", "2", "False"], result.stderr
    assert "model 'outputs/tiny-qwen2': no such directory, and not a Hub id (outputs/ exists here" in result.stderr


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("adapter")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", task_type="CAUSAL_LM", init_lora_weights=False)
    get_peft_model(base, lora).save_pretrained(path)
    assert json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"] == tiny_model_dir
    return str(path)


def test_an_adapter_directory_as_model_is_evaluated_on_its_base_model(adapter_dir, tiny_model_dir, tmp_path):
    results = eval_script.main(
        [
            "--model",
            adapter_dir,
            "--dataset_files",
            TOY_ROWS,
            "--num_samples",
            "2",
            "--max_new_tokens",
            "4",
            "--max_problems",
            "2",
            "--backend",
            "transformers",
            "--output_dir",
            str(tmp_path / "out"),
        ]
    )
    assert (results["model"], results["adapter"]) == (tiny_model_dir, adapter_dir)
    assert results["benchmarks"]["toy_math"]["num_scored"] == 2


def test_adapter_directory_mistakes_name_the_fix(adapter_dir, tmp_path, capsys):
    line = one_error_line(["--model", adapter_dir, "--adapter", adapter_dir, "--dataset_files", TOY_ROWS], capsys)
    assert "is a PEFT adapter directory" in line and "--adapter" in line
    moved = tmp_path / "moved-adapter"
    moved.mkdir()
    config = json.loads(Path(adapter_dir, "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    line = one_error_line(
        ["--model", str(moved), "--dataset_files", TOY_ROWS, "--output_dir", str(tmp_path / "out")], capsys
    )
    assert f"the base model of adapter {str(moved)!r}" in line and "no such directory, and not a Hub id" in line


def test_earlier_samples_are_kept_unless_overwrite_or_resume_says_otherwise(tmp_path):
    config = EvalConfig(model="scripted", dataset_files=[TOY_ROWS], num_samples=2, output_dir=str(tmp_path))
    evaluate(config, backend=EchoBackend(), progress=False)
    samples = tmp_path / "samples.jsonl"
    before = samples.read_text()

    fewer = EvalConfig(
        model="scripted", dataset_files=[TOY_ROWS], num_samples=2, max_problems=2, output_dir=str(tmp_path)
    )
    with pytest.raises(ValueError, match=rf"already holds {TOY_PROBLEMS} scored problem\(s\).*--overwrite true"):
        evaluate(fewer, backend=EchoBackend(), progress=False)
    assert samples.read_text() == before

    backend = EchoBackend()
    evaluate(
        EvalConfig(model="scripted", dataset_files=[TOY_ROWS], num_samples=2, output_dir=str(tmp_path), resume=True),
        backend=backend,
        progress=False,
    )
    assert backend.prompts_seen == [] and samples.read_text() == before  # all scored already

    fewer.overwrite = True
    evaluate(fewer, backend=EchoBackend(), progress=False)
    assert len(samples.read_text().splitlines()) == 2
    with pytest.raises(ValueError, match="set one of them"):
        EvalConfig(model="m", dataset_files=[TOY_ROWS], resume=True, overwrite=True)


def test_rows_from_a_local_file_are_labelled_with_the_file(tmp_path):
    rows = tmp_path / "my_amc_rows.jsonl"
    rows.write_text('{"question": "What is 2 + 3?", "answer": 5.0}\n')
    config = EvalConfig(model="scripted", benchmarks=[f"amc23={rows}"], num_samples=1, output_dir=str(tmp_path / "o"))
    results = evaluate(config, backend=EchoBackend(), progress=False)
    assert list(results["benchmarks"]) == ["amc23=my_amc_rows.jsonl"]
    record = json.loads((tmp_path / "o" / "samples.jsonl").read_text())
    assert record["benchmark"] == "amc23=my_amc_rows.jsonl"
    assert "| amc23=my_amc_rows.jsonl |" in (tmp_path / "o" / "results.md").read_text()


@pytest.mark.parametrize(
    ("current", "cores", "load", "processes", "expected"),
    [
        (2, 2, 0.0, 1, 2),  # an idle machine: torch's own choice
        (2, 2, 5.0, 1, 1),  # every core busy: one thread
        (8, 8, 3.0, 1, 5),  # the idle cores
        (8, 8, 0.0, 2, 4),  # two processes share the cores
        (4, 16, 0.0, 1, 4),  # never more than torch's choice
    ],
)
def test_suggested_threads(current, cores, load, processes, expected):
    from riskpo_trl.scripts import cpu_threads

    assert cpu_threads.suggested_threads(current, cores, load, processes) == expected


@pytest.fixture
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_cpu_run_without_omp_num_threads_picks_a_count_and_says_so(monkeypatch, caplog, restore_torch_threads):
    from riskpo_trl.scripts import cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (6.0, 6.0, 6.0))
    torch.set_num_threads(2)
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.scripts.cpu_threads"):
        assert cpu_threads.use_default_cpu_threads(use_cpu=True) == 1
    assert torch.get_num_threads() == 1
    assert "CPU run: 1 torch thread(s) (2 usable core(s), load average 6.0" in caplog.text
    assert "OMP_NUM_THREADS" in caplog.text

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert cpu_threads.use_default_cpu_threads(use_cpu=True) is None
    assert torch.get_num_threads() == 2  # the user's choice stands


def test_riskpo_eval_uses_the_cpu_thread_default(tiny_model_dir, monkeypatch, tmp_path, caplog, restore_torch_threads):
    from riskpo_trl.scripts import cpu_threads  # a module of its own, shared with riskpo-train

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads, "running_on_cpu", lambda use_cpu=False: True)
    monkeypatch.setattr(cpu_threads.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.scripts.cpu_threads"), pytest.raises(SystemExit):
        # stops at the missing rows file, after the thread count is set and before the model loads
        eval_script.cli(
            [
                "--model",
                tiny_model_dir,
                "--dataset_files",
                str(tmp_path / "missing.jsonl"),
                "--output_dir",
                str(tmp_path / "out"),
            ]
        )
    assert "CPU run: 1 torch thread(s)" in caplog.text
