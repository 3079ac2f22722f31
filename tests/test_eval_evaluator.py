"""The evaluator end to end on local rows: scoring, files written as the run goes, resume, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_ARCHER_SOLUTIONS, fenced, geometry3k_parquet
from PIL import Image

from riskpo_trl.evaluation import EvalConfig, evaluate, load_rows_file
from riskpo_trl.evaluation.generation import Sample, is_vllm_available, load_backend
from riskpo_trl.multimodal import build_tiny_vlm
from riskpo_trl.scripts.eval import main as eval_main
from riskpo_trl.tracks import load_benchmark

TOY_ROWS = str(Path(__file__).parent / "data" / "toy_math.jsonl")
TINY_ARCHER_CODE = str(Path(__file__).parents[1] / "examples" / "data" / "tiny_archer_code.jsonl")


class ScriptedBackend:
    """Answers each problem with given completions instead of sampling, and counts the prompts it was asked."""

    class _Tokenizer:
        chat_template = None

    tokenizer = _Tokenizer()

    def __init__(self, answers: dict[str, list[str]], fail_after_calls: int | None = None):
        self.answers = answers
        self.fail_after_calls = fail_after_calls
        self.prompts_seen: list[str] = []
        self.images_seen: list = []

    def generate(self, prompts, settings, images=None):
        if self.fail_after_calls is not None and len(self.prompts_seen) >= self.fail_after_calls:
            raise RuntimeError("simulated crash (out of memory)")
        self.prompts_seen += prompts
        self.images_seen += images or []
        results = []
        for prompt in prompts:
            texts = next(texts for problem, texts in self.answers.items() if problem in prompt)
            assert len(texts) == settings.num_samples
            results.append([Sample(text, num_tokens=len(text)) for text in texts])
        return results


ANSWERS = {
    "2 + 3": ["So the answer is \\boxed{5}.", "\\boxed{6}", "\\boxed{5}", "I don't know"],
    "7 - 4": ["\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{4}"],
    "6 / 3": ["\\boxed{2}", "\\boxed{2}", "\\boxed{2}", "\\boxed{2}"],
    "half of 1": ["\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{2}", "\\boxed{1}"],
    "lost its gold answer": ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{4}"],
}


def test_scores_and_metrics_with_math_verify(tmp_path):
    config = EvalConfig(model="scripted", dataset_files=[TOY_ROWS], num_samples=4, ks=[1, 4], output_dir=str(tmp_path))
    results = evaluate(config, backend=ScriptedBackend(ANSWERS), progress=False)

    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    scores = {record["index"]: record["scores"] for record in records}
    assert scores[0] == [1.0, 0.0, 1.0, 0.0]
    assert scores[1] == [0.0] * 4
    assert scores[2] == [1.0] * 4
    assert scores[3] == [1.0, 1.0, 0.0, 0.0]  # 0.5 and 1/2 both equal \frac{1}{2}
    assert scores[4] == [0.0] * 4 and records[4]["gold_unscorable"]  # empty gold cannot be parsed: all wrong

    summary = results["benchmarks"]["toy_math"]
    assert summary["complete"] and summary["num_scored"] == 5 and summary["num_unscorable_gold"] == 1
    assert summary["metrics"]["avg@4"] == pytest.approx((0.5 + 0 + 1 + 0.5 + 0) / 5)
    assert summary["metrics"]["pass@4"] == pytest.approx(3 / 5)
    assert results["average"] == summary["metrics"]  # one benchmark: the average is that benchmark

    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["benchmarks"]["toy_math"]["metrics"] == summary["metrics"]
    table = (tmp_path / "results.md").read_text()
    assert "| Metric | toy_math | Avg. |" in table and "| Pass@4 (%) | 60.0 | 60.0 |" in table
    assert "Sampling: 4 completions per problem, temperature 0.8, top-p 1.0, at most 1024 new tokens, seed 0." in table
    assert "cannot parse" in table


def test_the_table_says_how_its_completions_were_sampled(tmp_path):
    config = EvalConfig(
        model="scripted",
        dataset_files=[TOY_ROWS],
        num_samples=4,
        ks=[1, 4],
        temperature=0.6,
        top_p=0.95,
        max_new_tokens=512,
        max_problems=2,
        seed=7,
        output_dir=str(tmp_path),
    )
    evaluate(config, backend=ScriptedBackend(ANSWERS), progress=False)
    table = (tmp_path / "results.md").read_text()
    assert (
        "Sampling: 4 completions per problem, temperature 0.6, top-p 0.95, at most 512 new tokens, seed 7; the "
        "first 2 problems of each benchmark."
    ) in table.splitlines()


def test_partial_results_survive_a_crash_and_resume_finishes(tmp_path):
    config = EvalConfig(
        model="scripted", dataset_files=[TOY_ROWS], num_samples=4, ks=[1], output_dir=str(tmp_path), batch_size=2
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        evaluate(config, backend=ScriptedBackend(ANSWERS, fail_after_calls=2), progress=False)
    partial = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["toy_math"]
    assert partial["num_scored"] == 2 and not partial["complete"]
    assert partial["metrics"]["pass@1"] == pytest.approx((0.5 + 0.0) / 2)
    assert "partial" in (tmp_path / "results.md").read_text()

    config.resume = True
    backend = ScriptedBackend(ANSWERS)
    results = evaluate(config, backend=backend, progress=False)
    assert len(backend.prompts_seen) == 3  # only the problems the crashed run had not scored
    assert results["benchmarks"]["toy_math"]["complete"]
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 5


def test_resume_with_other_sampling_settings_is_refused_before_loading_the_model(tmp_path):
    config = EvalConfig(
        model="scripted", dataset_files=[TOY_ROWS], num_samples=4, ks=[1], output_dir=str(tmp_path), batch_size=2
    )
    with pytest.raises(RuntimeError, match="simulated crash"):
        evaluate(config, backend=ScriptedBackend(ANSWERS, fail_after_calls=1), progress=False)
    record = json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])
    assert record["sampling"] == {"num_samples": 4, "temperature": 0.8, "top_p": 1.0, "max_new_tokens": 1024}

    never_loaded = str(tmp_path / "never-loaded")  # the check runs before any model is loaded
    fewer = EvalConfig(
        model=never_loaded, dataset_files=[TOY_ROWS], num_samples=2, output_dir=str(tmp_path), resume=True
    )
    with pytest.raises(ValueError, match=r"num_samples=4 \(now 2\)"):
        evaluate(fewer, progress=False)
    hotter = EvalConfig(
        model=never_loaded, dataset_files=[TOY_ROWS], num_samples=4, temperature=1.0, top_p=0.95,
        output_dir=str(tmp_path), resume=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"temperature=0.8 \(now 1.0\), top_p=1.0 \(now 0.95\)"):
        evaluate(hotter, progress=False)


def test_cli_evaluates_tiny_model_end_to_end(tiny_model_dir, tmp_path, capsys):
    output_dir = tmp_path / "eval"
    results = eval_main([
        "--model", tiny_model_dir, "--dataset_files", TOY_ROWS, "--num_samples", "3", "--ks", "1", "3",
        "--max_new_tokens", "6", "--backend", "transformers", "--batch_size", "5", "--logprobs", "true",
        "--output_dir", str(output_dir),
    ])  # fmt: skip
    assert results["backend"] == "TransformersBackend"
    summary = results["benchmarks"]["toy_math"]
    assert summary["complete"] and set(summary["metrics"]) == {"pass@1", "pass@3", "avg@3"}
    assert 0 < summary["mean_completion_tokens"] <= 6
    records = [json.loads(line) for line in (output_dir / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 5 and all(len(record["completions"]) == 3 for record in records)
    logprobs = [lp for record in records for lp in record["mean_logprobs"]]
    assert all(lp < 0 for lp in logprobs)  # mean log-probabilities of sampled tokens
    assert "| Pass@3 (%) |" in capsys.readouterr().out


def test_bad_input_gives_clear_errors(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match="num_samples=4"):
        EvalConfig(model="m", dataset_files=[TOY_ROWS], num_samples=4, ks=[1, 8])
    with pytest.raises(ValueError, match="Nothing to evaluate"):
        EvalConfig(model="m")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_rows_file(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1 + 1?", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"row 0: missing field\(s\) \['problem'\]"):
        load_rows_file(bad)
    with pytest.raises(RuntimeError, match="Could not load model"):
        load_backend("transformers", str(tmp_path / "no-such-model"))
    with pytest.raises(ValueError, match="backend='tpu'"):
        load_backend("tpu", tiny_model_dir)


def test_unknown_benchmark_fails_before_loading_a_model(tmp_path):
    config = EvalConfig(model=str(tmp_path / "never-loaded"), benchmarks=["aime2099"], output_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"benchmark='aime2099' is unknown"):
        evaluate(config, progress=False)


def test_named_benchmark_from_local_file_in_its_hub_schema(tmp_path):
    # AMC23's Hub schema: question / answer (numeric); the adapter maps it to problem / answer / prompt.
    rows = tmp_path / "amc23.jsonl"
    rows.write_text('{"question": "What is 2 + 3?", "answer": 5.0}\n{"question": "What is 6 / 3?", "answer": 2}\n')
    config = EvalConfig(
        model="scripted", benchmarks=[f"amc23={rows}"], num_samples=4, ks=[1], output_dir=str(tmp_path / "out")
    )
    backend = ScriptedBackend(ANSWERS)
    results = evaluate(config, backend=backend, progress=False)
    assert "Please reason step by step" in backend.prompts_seen[0]  # the instruction added by the adapter
    assert results["benchmarks"]["amc23=amc23.jsonl"]["metrics"]["pass@1"] == pytest.approx((0.5 + 1.0) / 2)


@pytest.mark.skipif(is_vllm_available(), reason="checks the message shown when vLLM is missing")
def test_vllm_backend_without_vllm_says_how_to_install(tiny_model_dir):
    with pytest.raises(ImportError, match=r"riskpo-trl\[vllm\]"):
        load_backend("vllm", tiny_model_dir)


# --- a scorer per benchmark kind --------------------------------------------------------------------------------


def test_code_benchmark_is_graded_by_running_the_programs_in_the_sandbox(tmp_path):
    prompts = [row["prompt"][-1]["content"] for row in load_benchmark("livecodebench_v5", data_files=TINY_ARCHER_CODE)]
    answers = {
        prompt: [fenced(solution), fenced("print(0)")] for prompt, solution in zip(prompts, TINY_ARCHER_SOLUTIONS)
    }
    config = EvalConfig(
        model="scripted",
        benchmarks=[f"livecodebench_v5={TINY_ARCHER_CODE}"],
        num_samples=2,
        output_dir=str(tmp_path),
        code_sandbox='{"max_workers": 2}',
    )
    results = evaluate(config, backend=ScriptedBackend(answers), progress=False)
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [record["scores"] for record in records] == [[1.0, 0.0]] * len(TINY_ARCHER_SOLUTIONS)
    assert not any(record["gold_unscorable"] for record in records)
    summary = results["benchmarks"]["livecodebench_v5=tiny_archer_code.jsonl"]
    assert summary["complete"] and summary["metrics"] == {"pass@1": 0.5, "pass@2": 1.0, "avg@2": 0.5}


def test_geometry_benchmark_shows_the_diagrams_and_grades_the_solution(tmp_path):
    data = geometry3k_parquet(tmp_path / "geometry3k.parquet", 4)
    answers = {f"angle is {i}0 degrees": [f"x = \\boxed{{{i}}}", "\\boxed{99}"] for i in range(4)}
    config = EvalConfig(
        model="scripted", benchmarks=[f"geometry3k_test={data}"], num_samples=2, output_dir=str(tmp_path / "out")
    )
    backend = ScriptedBackend(answers)
    results = evaluate(config, backend=backend, progress=False)
    assert len(backend.images_seen) == 4 and all(
        len(images) == 1 and isinstance(images[0], Image.Image) for images in backend.images_seen
    )
    records = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert [record["scores"] for record in records] == [[1.0, 0.0]] * 4
    assert [record["answer"] for record in records] == ["0", "1", "2", "3"]  # Geometry3K's gold, as `solution`
    assert results["benchmarks"]["geometry3k_test=geometry3k.parquet"]["metrics"]["pass@2"] == 1.0


def test_code_benchmark_with_the_tiny_model(tiny_model_dir, tmp_path):
    config = EvalConfig(
        model=tiny_model_dir,
        benchmarks=[f"livecodebench_v5={TINY_ARCHER_CODE}"],
        num_samples=2,
        max_new_tokens=8,
        max_problems=3,
        backend="transformers",
        output_dir=str(tmp_path),
        code_sandbox='{"max_workers": 2}',
    )
    summary = evaluate(config, progress=False)["benchmarks"]["livecodebench_v5=tiny_archer_code.jsonl"]
    # A random model writes no program: every sample is graded, and fails.
    assert summary["complete"] and summary["num_scored"] == 3 and summary["num_unscorable_gold"] == 0
    assert summary["metrics"]["pass@2"] == 0.0


def test_geometry_benchmark_with_the_tiny_vision_language_model(tmp_path):
    model_dir = tmp_path / "tiny-vlm"
    build_tiny_vlm(model_dir)
    data = geometry3k_parquet(tmp_path / "geometry3k.parquet", 3)
    config = EvalConfig(
        model=str(model_dir),
        benchmarks=[f"geometry3k_test={data}"],
        num_samples=2,
        max_new_tokens=6,
        backend="transformers",
        batch_size=2,
        output_dir=str(tmp_path / "out"),
    )
    results = evaluate(config, progress=False)
    summary = results["benchmarks"]["geometry3k_test=geometry3k.parquet"]
    assert results["backend"] == "TransformersBackend"
    assert summary["complete"] and summary["num_scored"] == 3 and 0 < summary["mean_completion_tokens"] <= 6
    assert 0.0 <= summary["metrics"]["pass@1"] <= 1.0


def test_offline_hub_benchmark_fails_with_the_local_file_form(tmp_path):
    """With HF_HUB_OFFLINE=1 and nothing cached, riskpo-eval says the data is not available offline (no retries,
    no raw ConnectionError) and shows how to name local files."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"),
    }
    model_dir = tmp_path / "never-loaded"  # local: a Hub id not in the cache would be refused first, offline
    model_dir.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "riskpo_trl.scripts.eval",
            "--model",
            str(model_dir),
            "--benchmarks",
            "math500",
            "--output_dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode != 0
    assert "riskpo-eval: error: 'math500'" in result.stderr and "not available offline" in result.stderr
    assert "--benchmarks math500=PATH" in result.stderr
    assert "Traceback" not in result.stderr
