"""Metrics of scored problem records, and the results table like the paper's Table 1."""

from __future__ import annotations

from typing import Any

from .metrics import benchmark_metrics


def summarize_benchmark(records: list[dict[str, Any]], num_problems: int, ks: list[int]) -> dict[str, Any]:
    """Metrics of one benchmark from its scored problem records (possibly a partial run)."""
    summary: dict[str, Any] = {
        "num_problems": num_problems,
        "num_scored": len(records),
        "complete": len(records) == num_problems,
        "num_unscorable_gold": sum(record["gold_unscorable"] for record in records),
    }
    if records:
        summary["metrics"] = benchmark_metrics([record["scores"] for record in records], ks)
        lengths = [n for record in records for n in record["num_tokens"]]
        summary["mean_completion_tokens"] = sum(lengths) / len(lengths)
    return summary


def average_metrics(benchmarks: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Unweighted mean over benchmarks of each metric (the paper's Avg. column); only complete benchmarks count."""
    complete = [summary["metrics"] for summary in benchmarks.values() if summary["complete"] and "metrics" in summary]
    if not complete:
        return {}
    shared = [key for key in complete[0] if all(key in metrics for metrics in complete)]
    return {key: sum(metrics[key] for metrics in complete) / len(complete) for key in shared}


def sampling_line(config: dict[str, Any]) -> str:
    """How the table's completions were sampled, from the run's config (as ``results.json`` stores it)."""
    line = (
        f"Sampling: {config['num_samples']} completions per problem, temperature {config['temperature']}"
        f"{' (greedy)' if config['temperature'] == 0 else ''}, top-p {config['top_p']}, at most "
        f"{config['max_new_tokens']} new tokens, seed {config['seed']}"
    )
    if config.get("max_problems"):
        line += f"; the first {config['max_problems']} problems of each benchmark"
    return line + "."


def model_line(results: dict[str, Any]) -> str:
    """The model evaluated, saying so when it is the tiny random test model (or trained from it)."""
    line = f"Model: `{results['model']}`" + (f" + adapter `{results['adapter']}`" if results.get("adapter") else "")
    if results.get("tiny_random_model"):
        line += (
            " (the tiny RANDOM model of riskpo_trl.tiny_model, or a model trained from it: its scores say nothing "
            "about a real model)"
        )
    return line + "."


def prompt_lines(results: dict[str, Any]) -> list[str]:
    """Where each benchmark's prompts come from, and how chat messages became the text the model continued."""
    prompts = results.get("prompts")
    if not prompts:
        return []
    chat = (
        "chat messages rendered with the tokenizer's chat template"
        if results.get("chat_template")
        else "chat messages joined as plain text (the tokenizer has no chat template)"
    )
    return [
        "Prompts (" + chat + "; samples.jsonl holds each one as the model saw it):",
        *[f"- {name}: {source}" for name, source in prompts.items()],
        "",
    ]


def markdown_table(results: dict[str, Any]) -> str:
    """Results as a table like the paper's Table 1: benchmarks as columns plus Avg., metrics as rows, in percent."""
    benchmarks = results["benchmarks"]
    names = list(benchmarks)
    metric_names: list[str] = []
    for summary in benchmarks.values():
        metric_names += [key for key in summary.get("metrics", {}) if key not in metric_names]
    header = "| Metric | " + " | ".join(names) + " | Avg. |"
    lines = [
        model_line(results),
        "",
        *([sampling_line(results["config"]), ""] if results.get("config") else []),
        *prompt_lines(results),
        header,
        "|" + " --- |" * (len(names) + 2),
    ]
    scored = [benchmarks[name]["num_scored"] for name in names]
    totals = [benchmarks[name]["num_problems"] for name in names]
    lines.append(
        "| Problems scored | "
        + " | ".join(f"{s}/{t}" for s, t in zip(scored, totals))
        + f" | {sum(scored)}/{sum(totals)} |"
    )
    for key in metric_names:
        cells = []
        for name in names:
            value = benchmarks[name].get("metrics", {}).get(key)
            mark = "" if benchmarks[name]["complete"] else "*"
            cells.append("-" if value is None else f"{100 * value:.1f}{mark}")
        average = results["average"].get(key)
        cells.append("-" if average is None else f"{100 * average:.1f}")
        label = key.replace("pass@", "Pass@").replace("avg@", "Avg@")
        lines.append(f"| {label} (%) | " + " | ".join(cells) + " |")  # percent, where the progress bar shows fractions
    if any(not summary["complete"] for summary in benchmarks.values()):
        lines += ["", "\\* partial: not every problem scored yet; Avg. uses complete benchmarks only."]
    unscorable = {name: s["num_unscorable_gold"] for name, s in benchmarks.items() if s["num_unscorable_gold"]}
    if unscorable:
        lines += [
            "",
            "Problems whose gold answer math-verify cannot parse, or whose tests cannot be run (counted "
            f"wrong): {unscorable}.",
        ]
    return "\n".join(lines) + "\n"
