"""Tables and figures of the short protocol from whatever runs have finished."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks._common import (
    headless_pyplot,
    json_exists,
    mean_std,
    read_json,
    save_figure,
    write_results,
)

from .config import METHOD_LABELS, SELECTION_CRITERION, LMConfig
from .run import run_name, select_lrs


def load_runs(cfg: LMConfig, out_dir: Path, methods: list[str]) -> dict[str, dict[str, Any]]:
    runs = {}
    for method in methods:
        for lr in cfg.learning_rates:
            for seed in sorted({cfg.grid_seed, *cfg.test_seeds}):
                path = out_dir / "runs" / f"{run_name(method, lr, seed)}.json"
                if json_exists(path):
                    runs[run_name(method, lr, seed)] = read_json(path)
    return runs


def _tail_mean(values: list[float], fraction: float = 0.25) -> float:
    values = [v for v in values if v is not None]
    if not values:
        return float("nan")
    tail = values[-max(1, int(len(values) * fraction)) :]
    return sum(tail) / len(tail)


def summarize(cfg: LMConfig, out_dir: Path, methods: list[str]) -> dict[str, Any]:
    runs = load_runs(cfg, out_dir, methods)
    chosen = select_lrs(cfg, out_dir, methods)
    grid = {
        name: {
            "method": r["method"],
            "lr": r["lr"],
            "seed": r["seed"],
            "selection_score": r["selection_score"],
            "val_pass@1": r["val"]["all"]["pass@1"],
            f"val_pass@{cfg.ks[-1]}": r["val"]["all"][f"pass@{cfg.ks[-1]}"],
            "test_pass@1": r["test"]["all"]["pass@1"],
            "train_seconds": r["train_seconds"],
        }
        for name, r in runs.items()
        if r["seed"] == cfg.grid_seed
    }
    table: dict[str, Any] = {}
    buckets = ["all"] + [f"{d}digit" for d in cfg.digits]
    for method, lr in chosen.items():
        rs = [runs[run_name(method, lr, s)] for s in cfg.test_seeds if run_name(method, lr, s) in runs]
        if not rs:
            continue
        row: dict[str, Any] = {"lr": lr, "seeds": [r["seed"] for r in rs]}
        for bucket in buckets:
            for k in cfg.ks:
                row[f"{bucket}/pass@{k}"] = mean_std([r["test"][bucket][f"pass@{k}"] for r in rs])
        for key in ("entropy", "reward", "lower_rvar", "logprob_adv_cov", "logprob_adv_corr"):
            row[f"final_{key}"] = mean_std([_tail_mean(r["curves"][key]) for r in rs])
        row["mean_logprob_adv_corr"] = mean_std(
            [sum(r["curves"]["logprob_adv_corr"]) / max(1, len(r["curves"]["logprob_adv_corr"])) for r in rs]
        )
        row["train_seconds"] = mean_std([r["train_seconds"] for r in rs])
        table[method] = row
    return {"chosen_lr": chosen, "grid": grid, "methods": table, "runs": runs}


def _markdown(
    cfg: LMConfig,
    sft: dict[str, Any],
    summary: dict[str, Any],
    methods: list[str],
    missing: list[str],
    timing: dict[str, Any],
    diagnostics: dict[str, Any] | None = None,
) -> str:
    top = cfg.ks[-1]
    ks_shown = [k for k in (1, 2, 4, 8, 16) if k in cfg.ks]
    buckets = [f"{d}digit" for d in cfg.digits]
    lines = [
        "# Tiny-LM study: mixed-length addition with a hard tail (CPU)",
        "",
        f"SFT start ({sft['steps']} SFT steps), test split: "
        + "; ".join(
            f"{b}: Pass@1 {sft['test'][b]['pass@1']:.3f}, Pass@{top} {sft['test'][b][f'pass@{top}']:.3f}"
            for b in ["all", *buckets]
        ),
        f"RL: {cfg.generation_batches} generation batches x {cfg.prompts_per_generation} prompts x "
        f"{cfg.num_generations} completions, {cfg.updates_per_generation} updates per batch, temperature "
        f"{cfg.temperature}; lr grid {list(cfg.learning_rates)} at seed {cfg.grid_seed}, chosen by: "
        f"{SELECTION_CRITERION}; test seeds {list(cfg.test_seeds)}, mean ± std.",
    ]
    if missing:
        lines += ["", "Not finished (rerun the command to resume): " + ", ".join(missing) + "."]
    lines += [
        "",
        "## Test results at the chosen lr",
        "",
        "| method | lr | "
        + " | ".join(f"Pass@{k}" for k in ks_shown)
        + " | entropy (last 25%) | lower RVaR (last 25%) | corr(log pi, A) (mean) |",
        "|---" * (len(ks_shown) + 5) + "|",
    ]
    for method, row in summary["methods"].items():
        cells = [f"{row[f'all/pass@{k}'][0]:.3f} ± {row[f'all/pass@{k}'][1]:.3f}" for k in ks_shown]
        cells += [
            f"{row[key][0]:.3f} ± {row[key][1]:.3f}"
            for key in ("final_entropy", "final_lower_rvar", "mean_logprob_adv_corr")
        ]
        lines.append(f"| {METHOD_LABELS[method]} | {row['lr']:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Test Pass@1 / Pass@16 per difficulty bucket",
        "",
        "| method | " + " | ".join(f"{b} Pass@1 | {b} Pass@{top}" for b in buckets) + " |",
        "|---" * (2 * len(buckets) + 1) + "|",
        "| SFT start | "
        + " | ".join(f"{sft['test'][b]['pass@1']:.3f} | {sft['test'][b][f'pass@{top}']:.3f}" for b in buckets)
        + " |",
    ]
    for method, row in summary["methods"].items():
        cells = []
        for b in buckets:
            cells += [
                f"{row[f'{b}/pass@1'][0]:.3f} ± {row[f'{b}/pass@1'][1]:.3f}",
                f"{row[f'{b}/pass@{top}'][0]:.3f} ± {row[f'{b}/pass@{top}'][1]:.3f}",
            ]
        lines.append(f"| {METHOD_LABELS[method]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## The whole lr grid (seed {cfg.grid_seed}; selection on validation)",
        "",
        f"| method | lr | val Pass@1 | val Pass@{top} | criterion | chosen | test Pass@1 | train s |",
        "|---" * 8 + "|",
    ]
    for name, g in sorted(summary["grid"].items(), key=lambda kv: (methods.index(kv[1]["method"]), kv[1]["lr"])):
        chosen = "yes" if summary["chosen_lr"].get(g["method"]) == g["lr"] else ""
        lines.append(
            f"| {METHOD_LABELS[g['method']]} | {g['lr']:g} | {g['val_pass@1']:.3f} | "
            f"{g[f'val_pass@{top}']:.3f} | {g['selection_score']:.3f} | {chosen} | {g['test_pass@1']:.3f} | "
            f"{g['train_seconds']:.0f} |"
        )
    if diagnostics:
        lines += [
            "",
            f"## Gradient noise at the SFT start ({diagnostics['num_batches']} paired generation batches)",
            "",
            "| method | SNR of batch gradient | cos(mean gradient, GRPO's) | cos(mean gradient, grad log-lik of "
            "right answers) | mean batch cos with it | A > 0 / A < 0 | share of abs(A): " + " / ".join(buckets) + " |",
            "|---|---|---|---|---|---|---|",
        ]
        for m, d in diagnostics["methods"].items():
            cos = d["cosine_of_mean_gradient_with_grpo"]
            lines.append(
                f"| {METHOD_LABELS[m]} | {d['snr']:.4f} | {'' if cos is None else f'{cos:.3f}'} | "
                f"{d['cosine_of_mean_gradient_with_answer_loglik']:+.3f} | "
                f"{d['mean_batch_cosine_with_answer_loglik']:+.3f} | "
                f"{d['fraction_positive_advantage']:.2f} / "
                f"{d['fraction_negative_advantage']:.2f} | "
                + " / ".join(f"{d['abs_advantage_share_by_bucket'][b]:.2f}" for b in buckets)
                + " |"
            )
    lines += [
        "",
        timing_line(timing),
    ]
    return "\n".join(lines)


def _smooth(values, window: int):
    import numpy as np

    values = np.asarray(values, dtype=float)
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, len(values) + 1)
    return (cumsum[1:] - cumsum[np.maximum(idx - window, 0)]) / np.minimum(idx, window)


def plot(cfg: LMConfig, sft: dict[str, Any], summary: dict[str, Any], out_dir: Path) -> list[Path]:
    plt = headless_pyplot()
    import numpy as np

    paths = []
    keys = [
        ("reward", "mean reward"),
        ("entropy", "token entropy"),
        ("lower_rvar", f"lower-tail RVaR (alpha={cfg.risk_alpha}, B={cfg.bundle_size})"),
        ("logprob_adv_corr", "corr(log pi, A) within groups"),
    ]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for method, row in summary["methods"].items():
        rs = [summary["runs"][run_name(method, row["lr"], s)] for s in row["seeds"]]
        for ax, (key, title) in zip(axes, keys):
            length = min(len(r["curves"][key]) for r in rs)
            if length == 0:
                continue
            arr = np.array([r["curves"][key][:length] for r in rs], dtype=float)
            x = np.linspace(1, cfg.generation_batches, length)
            window = max(1, length // 10)
            mean, std = _smooth(arr.mean(0), window), _smooth(arr.std(0), window)
            ax.plot(x, mean, label=f"{METHOD_LABELS[method]} (lr {row['lr']:g})")
            ax.fill_between(x, mean - std, mean + std, alpha=0.2)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("generation batch")
    axes[0].legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / "lm_training_curves.png"))

    buckets = [f"{d}digit" for d in cfg.digits] + ["all"]
    fig, axes = plt.subplots(1, len(buckets), figsize=(3.8 * len(buckets), 3.4), sharey=True)
    for ax, bucket in zip(axes, buckets):
        ax.plot(cfg.ks, [sft["test"][bucket][f"pass@{k}"] for k in cfg.ks], "k--", label="SFT start")
        for method, row in summary["methods"].items():
            mean = np.array([row[f"{bucket}/pass@{k}"][0] for k in cfg.ks])
            std = np.array([row[f"{bucket}/pass@{k}"][1] for k in cfg.ks])
            ax.plot(cfg.ks, mean, marker=".", label=METHOD_LABELS[method])
            ax.fill_between(cfg.ks, mean - std, mean + std, alpha=0.15)
        ax.set_xscale("log", base=2)
        ax.set_title(f"test, {bucket}", fontsize=9)
        ax.set_xlabel("k")
    axes[0].set_ylabel("Pass@k")
    axes[0].legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / "lm_pass_at_k_by_difficulty.png"))
    return paths


def run_timing(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the runs recorded of their own time; the report adds nothing of the moment it is written, so it is a
    function of the cached runs alone."""
    return {
        "source": "train_seconds of each run file",
        "runs": len(runs),
        "train_seconds_total": sum(r["train_seconds"] for r in runs.values()),
    }


def timing_line(timing: dict[str, Any]) -> str:
    return (
        f"Timing: train seconds as each run recorded them (`train_seconds` in its run file), on CPU cores shared "
        f"with other jobs; {timing['runs']} runs, {timing['train_seconds_total'] / 60:.0f} min of training in all. "
        "The run files record neither the machine nor its load."
    )


def report(cfg: LMConfig, out_dir: Path, methods: list[str]):
    sft = json.loads((out_dir / "sft_summary.json").read_text())
    summary = summarize(cfg, out_dir, methods)
    expected = {run_name(m, lr, cfg.grid_seed) for m in methods for lr in cfg.learning_rates}
    expected |= {run_name(m, lr, s) for m, lr in summary["chosen_lr"].items() for s in cfg.test_seeds}
    missing = sorted(expected - set(summary["runs"]))
    missing += [f"{m} (test seeds: lr not chosen yet)" for m in methods if m not in summary["chosen_lr"]]
    timing = run_timing(summary["runs"])
    diagnostics_path = out_dir / "gradient_diagnostics.json"
    diagnostics = json.loads(diagnostics_path.read_text()) if diagnostics_path.exists() else None
    text = _markdown(cfg, sft, summary, methods, missing, timing, diagnostics)
    payload = {
        "config": asdict(cfg),
        "selection_criterion": SELECTION_CRITERION,
        "timing": timing,
        "not_finished": missing,
        "sft": sft,
        "gradient_diagnostics": diagnostics,
        **{k: v for k, v in summary.items() if k != "runs"},
    }
    write_results("lm_study", payload, text, out_dir)
    if summary["methods"]:
        plot(cfg, sft, summary, out_dir)
    print(text)
    return payload
