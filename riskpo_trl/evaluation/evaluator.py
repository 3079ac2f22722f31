"""Sample ``n`` completions per benchmark problem, grade them with the benchmark's scorer, report Pass@k / Avg@k.

The pieces: :mod:`.config` (what to run), :mod:`.benchmarks` (loading and prompts), :mod:`.scorers` (a grader per
benchmark kind: math, geometry, code), :mod:`.records` (files written as the run goes, resume) and :mod:`.report`
(metrics and the table). A crash loses at most one batch, and ``resume=True`` skips the problems already scored;
earlier samples in ``output_dir`` are never replaced unless ``overwrite=True`` says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import set_seed

from ..tiny_model import is_tiny_random_model
from .benchmarks import check_benchmark_names, problem_text, render_prompt, resolve_benchmarks
from .config import EvalConfig
from .generation import load_backend
from .records import (
    RESULTS_FILE,
    SAMPLES_FILE,
    TABLE_FILE,
    check_earlier_samples,
    check_resumable,
    check_same_prompt_template,
    read_done,
    sampling_record,
    write_atomic,
)
from .report import average_metrics, markdown_table, summarize_benchmark
from .sampling import Sample, SamplingSettings
from .scorers import Scorer, scorer_for


def _batches(indices: list[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(indices), size):
        yield indices[start : start + size]


def evaluate(
    config: EvalConfig,
    backend=None,
    scorer: Scorer | None = None,
    progress: bool = True,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the evaluation described by ``config`` and return the results (also written to ``config.output_dir``).

    ``backend`` (anything with ``generate(prompts, settings)`` and a ``tokenizer``; ``generate(..., images=...)`` for
    geometry) defaults to the one ``config.backend`` names. Each benchmark is graded by its kind's scorer
    (:func:`riskpo_trl.evaluation.scorers.scorer_for`); ``scorer(completion, gold) -> float | None`` replaces the
    math benchmarks' math-verify grading.
    """
    check_benchmark_names(config)
    settings = config.sampling
    output_dir = Path(config.output_dir)
    samples_path = output_dir / SAMPLES_FILE
    # Before the (slow) data and model loads: what to do with earlier samples.
    done = read_done(samples_path)
    check_earlier_samples(done, samples_path, resume=config.resume, overwrite=config.overwrite)
    if not config.resume:
        done = {}
    check_resumable(done, settings, samples_path)
    check_same_prompt_template(done, config.prompt_template, samples_path)
    benchmarks = resolve_benchmarks(config)
    scorers = {
        kind: scorer_for(kind, math_grader=scorer, sandbox_settings=config.code_sandbox)
        for kind in {benchmark.kind for benchmark in benchmarks}
    }
    if backend is None:
        backend = load_backend(
            config.backend,
            config.model,
            config.adapter,
            config.batch_size,
            config.dtype,
            seed=config.seed,
            vllm_kwargs=config.vllm_kwargs,
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    if not config.resume and samples_path.exists():
        samples_path.unlink()  # a fresh run: do not mix old samples into the new metrics

    results: dict[str, Any] = {
        "model": config.model,
        "adapter": config.adapter,
        "tiny_random_model": is_tiny_random_model(config.model),
        "backend": type(backend).__name__,
        "chat_template": getattr(backend.tokenizer, "chat_template", None) is not None,
        "prompts": {benchmark.name: benchmark.prompt for benchmark in benchmarks},
        "config": asdict(config),
        "benchmarks": {},
        "average": {},
    }
    records_by_benchmark = {b.name: list(done.get(b.name, {}).values()) for b in benchmarks}

    def write_results() -> None:
        for benchmark in benchmarks:
            results["benchmarks"][benchmark.name] = summarize_benchmark(
                records_by_benchmark[benchmark.name], len(benchmark.dataset), config.ks
            )
        results["average"] = average_metrics(results["benchmarks"])
        write_atomic(output_dir / RESULTS_FILE, json.dumps(results, indent=2))
        write_atomic(output_dir / TABLE_FILE, markdown_table(results))

    write_results()
    set_seed(config.seed)  # transformers sampling; a vLLM engine was seeded when load_backend built it
    with samples_path.open("a") as samples_file:
        for benchmark in benchmarks:
            name, dataset, bench_scorer = benchmark.name, benchmark.dataset, scorers[benchmark.kind]
            todo = [i for i in range(len(dataset)) if i not in done.get(name, {})]
            bar = tqdm(total=len(dataset), initial=len(dataset) - len(todo), desc=name, disable=not progress)
            for batch in _batches(todo, config.batch_size):
                rows = [dataset[i] for i in batch]
                prompts = [render_prompt(row, backend.tokenizer) for row in rows]
                for index, row, prompt, samples in zip(
                    batch, rows, prompts, _generate(backend, rows, prompts, settings)
                ):
                    scores, gold_unscorable = bench_scorer.score([s.text for s in samples], row)
                    record = {
                        "benchmark": name,
                        "index": index,
                        "problem": problem_text(row),
                        "prompt": prompt,  # the text the model continued
                        "answer": bench_scorer.gold(row),
                        "completions": [s.text for s in samples],
                        "scores": scores,
                        "num_tokens": [s.num_tokens for s in samples],
                        "mean_logprobs": [s.mean_logprob for s in samples] if settings.return_logprobs else None,
                        "gold_unscorable": gold_unscorable,
                        "sampling": sampling_record(settings),
                        "prompt_template": config.prompt_template,
                    }
                    samples_file.write(json.dumps(record) + "\n")
                    records_by_benchmark[name].append(record)
                    if on_result is not None:
                        on_result(record)
                samples_file.flush()
                write_results()
                bar.update(len(batch))
                metrics = results["benchmarks"][name].get("metrics", {})
                bar.set_postfix({k: f"{metrics[k]:.3f}" for k in ("pass@1", f"pass@{config.ks[-1]}") if k in metrics})
            bar.close()
    write_results()
    return results


def _generate(
    backend, rows: list[dict[str, Any]], prompts: list[str], settings: SamplingSettings
) -> list[list[Sample]]:
    """Samples for each row's rendered prompt; rows with ``images`` (geometry) pass them to the backend."""
    if any(row.get("images") for row in rows):
        return backend.generate(prompts, settings, images=[row["images"] for row in rows])
    return backend.generate(prompts, settings)
