"""The evaluator's vLLM backend against a real vLLM (the CPU build that `.ci/vllm_real.sh` installs).

Three engine start-ups in all (vLLM on 2 shared cores is slow to start): one engine inside this process, shared by
the module, and two `riskpo-eval` runs as subprocesses, one of them with all of vLLM's defaults (its own engine
process, torch.compile), as users run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import release_in_process_vllm
from transformers import AutoTokenizer

from riskpo_trl.evaluation import EvalConfig, evaluate
from riskpo_trl.evaluation.benchmarks import render_prompt
from riskpo_trl.evaluation.generation import VLLMBackend
from riskpo_trl.evaluation.records import RESULTS_FILE, SAMPLES_FILE, TABLE_FILE
from riskpo_trl.tiny_model import VLLM_CPU_SIZES, build_tiny_model

pytestmark = pytest.mark.vllm_real

ROOT = Path(__file__).resolve().parents[1]
TOY_ROWS = str(ROOT / "tests" / "data" / "toy_math.jsonl")
GREEDY_TOKENS = 24
SAMPLED = {"num_samples": 4, "temperature": 1.0, "max_new_tokens": 32, "ks": [1, 4], "seed": 3}
# The engine runs inside the calling process (one interpreter start-up instead of three) and skips torch.compile
# (minutes on 2 cores); the second subprocess run keeps vLLM's defaults, the user's path.
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
EAGER = {"enforce_eager": True}


def toy_prompts(tokenizer) -> list[str]:
    rows = [json.loads(line) for line in Path(TOY_ROWS).read_text().splitlines()]
    return [render_prompt(row, tokenizer) for row in rows]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A tiny model vLLM's CPU kernels take, with completions that depend on the prompt, and a generation config
    that stops on a second id besides EOS (Qwen-style list): a token its greedy completion of a problem writes."""
    path = tmp_path_factory.mktemp("tiny-vllm")
    model, tokenizer = build_tiny_model(path, **VLLM_CPU_SIZES, initializer_range=0.2)
    greedy = [
        model.generate(
            **tokenizer(prompt, return_tensors="pt", add_special_tokens=False),
            do_sample=False,
            max_new_tokens=GREEDY_TOKENS,
        )[0].tolist()
        for prompt in toy_prompts(tokenizer)
    ]
    stop_id = next(ids[-GREEDY_TOKENS // 2] for ids in greedy if tokenizer.eos_token_id not in ids)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop_id]
    model.generation_config.save_pretrained(path)
    return str(path)


def stop_char(model_dir: str) -> str:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos_ids = json.loads((Path(model_dir) / "generation_config.json").read_text())["eos_token_id"]
    return tokenizer.decode([eos_ids[1]])


class RecordingLLM:
    """Wraps the real ``vllm.LLM`` and keeps what each ``generate`` call returned (prompt token ids included)."""

    def __init__(self, llm):
        self.llm = llm
        self.outputs: list = []

    def generate(self, *args, **kwargs):
        outputs = self.llm.generate(*args, **kwargs)
        self.outputs.extend(outputs)
        return outputs

    def __getattr__(self, name):
        return getattr(self.llm, name)


@pytest.fixture(scope="module")
def engine(model_dir):
    """One vLLM engine in this process for the module; its first job is the seeded sampled run (below), which the
    subprocess runs must reproduce."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in IN_PROCESS_ENGINE.items():
            patch.setenv(name, value)
        backend = VLLMBackend(model_dir, seed=SAMPLED["seed"], dtype="float32", **EAGER)
    backend.llm = RecordingLLM(backend.llm)
    yield backend
    del backend
    release_in_process_vllm()


@pytest.fixture(scope="module")
def sampled_run(engine, model_dir, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("sampled-in-process")
    evaluate(
        EvalConfig(model=model_dir, dataset_files=[TOY_ROWS], output_dir=str(out), **SAMPLED),
        backend=engine,
        progress=False,
    )
    return read_samples(out)


def read_samples(output_dir) -> list[dict]:
    lines = (Path(output_dir) / SAMPLES_FILE).read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda record: record["index"])


def riskpo_eval(model_dir: str, output_dir: Path, env: dict[str, str] | None = None, **settings) -> list[dict]:
    """``riskpo-eval --backend vllm`` in a fresh interpreter, as a user runs it."""
    args = [
        sys.executable,
        "-m",
        "riskpo_trl.scripts.eval",
        "--model",
        model_dir,
        "--backend",
        "vllm",
        "--dataset_files",
        TOY_ROWS,
        "--dtype",
        "float32",
        "--output_dir",
        str(output_dir),
    ]
    for name, value in settings.items():
        if isinstance(value, dict):
            value = json.dumps(value)
        args += [f"--{name}", *map(str, value if isinstance(value, list) else [value])]
    result = subprocess.run(
        args, cwd=ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-4000:]
    for name in (SAMPLES_FILE, RESULTS_FILE, TABLE_FILE):
        assert (output_dir / name).is_file(), f"riskpo-eval wrote no {name}"
    assert json.loads((output_dir / RESULTS_FILE).read_text())["backend"] == "VLLMBackend"
    assert "toy_math" in (output_dir / TABLE_FILE).read_text()
    assert "toy_math" in result.stdout  # the table printed at the end
    return read_samples(output_dir)


def completions(records: list[dict]) -> list[list[str]]:
    return [record["completions"] for record in records]


def test_greedy_completions_equal_the_transformers_backend(engine, sampled_run, model_dir, tmp_path):
    config = EvalConfig(
        model=model_dir,
        dataset_files=[TOY_ROWS],
        num_samples=1,
        temperature=0.0,
        max_new_tokens=GREEDY_TOKENS,
        dtype="float32",
        output_dir=str(tmp_path / "vllm"),
    )
    by_vllm = read_samples_of(evaluate(config, backend=engine, progress=False), config)
    config.output_dir, config.backend = str(tmp_path / "transformers"), "transformers"
    by_transformers = read_samples_of(evaluate(config, progress=False), config)

    assert completions(by_vllm) == completions(by_transformers)
    assert [r["num_tokens"] for r in by_vllm] == [r["num_tokens"] for r in by_transformers]
    lengths = [record["num_tokens"][0] for record in by_vllm]
    # The problem whose completion holds the generation config's second EOS id stops there; others run on.
    assert min(lengths) < GREEDY_TOKENS and len(set(lengths)) > 1
    assert not any(stop_char(model_dir) in text for record in by_vllm for text in record["completions"])


def read_samples_of(results: dict, config: EvalConfig) -> list[dict]:
    assert results["benchmarks"]["toy_math"]["complete"]
    return read_samples(config.output_dir)


def test_prompts_reach_vllm_as_the_chat_template_renders_them(engine, sampled_run, model_dir):
    """Exactly the template's tokens: vLLM must not add special tokens (a second BOS) of its own."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    expected = [tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in toy_prompts(tokenizer)]
    sent = [list(output.prompt_token_ids) for output in engine.llm.outputs[: len(expected)]]
    assert sent == expected
    assert all(prompt.startswith("user: ") and prompt.endswith("assistant: ") for prompt in toy_prompts(tokenizer))


def test_sampling_gives_n_samples_within_max_tokens_and_stops_at_eos(sampled_run, model_dir):
    assert len(sampled_run) == 5
    assert all(len(record["completions"]) == SAMPLED["num_samples"] for record in sampled_run)
    lengths = [n for record in sampled_run for n in record["num_tokens"]]
    assert max(lengths) <= SAMPLED["max_new_tokens"]
    assert min(lengths) < SAMPLED["max_new_tokens"], "no completion stopped at an EOS id"
    # Sampling stops at the generation config's second EOS id (a visible character): the text never holds it.
    stop = stop_char(model_dir)
    assert not any(stop in text for record in sampled_run for text in record["completions"])
    assert len({text for record in sampled_run for text in record["completions"]}) > len(sampled_run)  # sampled
    assert all(record["sampling"]["temperature"] == SAMPLED["temperature"] for record in sampled_run)


def test_riskpo_eval_reproduces_a_seed_and_a_new_seed_changes_the_samples(sampled_run, model_dir, tmp_path):
    same_seed = riskpo_eval(model_dir, tmp_path / "seed3", env=IN_PROCESS_ENGINE, vllm_kwargs=EAGER, **SAMPLED)
    assert completions(same_seed) == completions(sampled_run)
    # The default engine (its own process, as users run it) with another seed: other samples, same shape.
    other_seed = riskpo_eval(model_dir, tmp_path / "seed4", **{**SAMPLED, "seed": 4})
    assert completions(other_seed) != completions(sampled_run)
    assert [len(c) for c in completions(other_seed)] == [SAMPLED["num_samples"]] * len(sampled_run)
