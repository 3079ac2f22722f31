"""Tabular study: where does RiskPO's advantage help a softmax policy, and does the paper's Proposition 1 hold?

One command (seconds to minutes on one core)::

    python -m benchmarks.tabular_study            # full grid, cached per run under benchmarks/results/tabular/runs
    python -m benchmarks.tabular_study --smoke    # trivial size, for the test suite
    python -m benchmarks.tabular_study --report-only   # the report from the cached runs

The model is the paper's own analysis setting (section 5): a tabular softmax policy ``pi(y|x) = softmax(theta[x])``
over ``NUM_ANSWERS`` answers for each of ``NUM_QUESTIONS`` questions, exactly one answer correct (reward 1, else 0).
The starting policy spreads the difficulty: question ``x`` starts with ``P(correct) = sigmoid(u_x)``, ``u_x`` evenly
spaced in ``[-6, 3]`` (from 0.25% to 95%), so a third of the questions are almost never solved at the start.

Every method samples the same batches (same seeds: ``P`` questions without replacement, ``G`` answers each), computes
one advantage per sampled answer and takes one Adam step on ``-mean(A * log pi(y|x))``. Only the advantage differs:

- ``grpo``: TRL's group advantage ``(r - mean_G) / (std_G + 1e-4)``;
- ``riskpo``: the paper's MVaR advantage with the project's code (``RiskEstimator``: ``permutation_bundles``, a
  ``QuantileTracker`` step, ``riskpo_advantages``), alpha 0.2, beta 0.8, omega 0.5, B 5, tracked quantiles (tracker
  lr 0.1);
- ``risk_seeking``: the same with ``risk_profile="risk_seeking"``;
- ``riskpo_authors``: the authors' DAPO-script advantage (``advantage_scaling="authors_code"``, quantiles of each
  bundle group, ``natural_baseline=False``, ``credit_assignment="sum_mean"``, omega 1.5).

Design, fixed in :class:`TabularConfig` before any run: the grid of prompts per step x Adam learning rates, the seeds
(identical for every method), the number of steps, the metrics (exact Pass@k for k = 1..16 from the policy's
probabilities, mean entropy, both per difficulty bucket) and the selection rule used only for the one-line summary
per method and batch size: the learning rate with the best seed-mean of (Pass@1 + Pass@16) / 2. Every cell is shown.

Proposition 1 check: for each method, the expected advantage of every (question, answer) pair at a fixed policy is
estimated by Monte Carlo through the same advantage code; a natural-gradient step ``theta += eta * A`` is applied and
the exact entropy change of every question is compared with ``-eta * Cov_{y~pi}(log pi(y|x), A(x, y))``.

Gradient diagnostics: at the starting policy, the per-batch policy gradient of every method is drawn many times to
measure its noise (signal-to-noise ratio of the batch gradient) and its alignment with the exact gradient of the mean
reward; this is the measurement behind the explanation of any loss in the report.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks._common import (
    headless_pyplot,
    json_exists,
    mean_std,
    read_json,
    save_figure,
    write_results,
)
from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser, write_json
from riskpo_trl.risk.estimator import RiskEstimator

METHODS = ("grpo", "riskpo", "risk_seeking", "riskpo_authors")
METHOD_LABELS = {
    "grpo": "GRPO",
    "riskpo": "RiskPO (MVaR, paper)",
    "risk_seeking": "Risk-seeking",
    "riskpo_authors": "RiskPO, authors' DAPO advantage",
}
AUTHORS_KEYWORDS = {
    "advantage_scaling": "authors_code",
    "natural_baseline": False,
    "credit_assignment": "sum_mean",
}
AUTHORS_ESTIMATOR = {**AUTHORS_KEYWORDS, "quantile_source": "group"}
# Methods the baseline cells add (benchmarks/tabular_baseline.py); not part of this study's own grid.
EXTRA_METHODS = {"riskpo_loo": "RiskPO (paper) + leave-one-out baseline"}
OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}
BUCKETS = {"hard": (0.0, 0.05), "medium": (0.05, 0.5), "easy": (0.5, 1.0)}  # by the starting P(correct)


@dataclass(frozen=True)
class TabularConfig:
    """The whole design, fixed before the runs."""

    num_questions: int = 200
    num_answers: int = 16
    start_logit_low: float = -6.0  # starting P(correct) = sigmoid(u), u evenly spaced in [low, high]
    start_logit_high: float = 3.0
    wrong_logit_std: float = 1.0  # the wrong answers' starting logits, N(0, std), drawn once (task seed 0)
    num_generations: int = 8
    steps: int = 300
    prompts_per_step: tuple[int, ...] = (10, 50, 200)
    learning_rates: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    bundle_size: int = 5
    risk_alpha: float = 0.2
    risk_beta: float = 0.8
    risk_omega: float = 0.5
    authors_omega: float = 1.5
    quantile_lr: float = 0.1
    ks: tuple[int, ...] = tuple(range(1, 17))
    curve_every: int = 10
    # Proposition 1
    prop1_mc_batches: int = 200
    prop1_etas: tuple[float, ...] = (0.001, 0.01, 0.1)
    prop1_trained_steps: int = 100  # the second policy state: GRPO, prompts 50, lr 0.03, seed 0, after these steps
    # gradient diagnostics
    grad_batches: int = 200
    grad_prompts: int = 50

    def scaled_down(self) -> TabularConfig:
        return replace(
            self,
            num_questions=20,
            steps=6,
            prompts_per_step=(10,),
            learning_rates=(0.1,),
            seeds=(0,),
            curve_every=2,
            prop1_mc_batches=4,
            prop1_etas=(0.01,),
            prop1_trained_steps=3,
            grad_batches=4,
            grad_prompts=10,
        )


# --- task --------------------------------------------------------------------------------------------------------


def starting_logits(cfg: TabularConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(theta0, start_p_correct)``; answer 0 is the correct one of every question."""
    gen = torch.Generator().manual_seed(0)
    wrong = torch.randn(cfg.num_questions, cfg.num_answers - 1, generator=gen, dtype=torch.float64)
    wrong = wrong * cfg.wrong_logit_std
    start_p = torch.sigmoid(
        torch.linspace(cfg.start_logit_low, cfg.start_logit_high, cfg.num_questions, dtype=torch.float64)
    )
    # P(correct) = e^c / (e^c + S), S = sum of e^wrong  =>  c = logit(p) + log S
    correct = torch.logit(start_p) + torch.logsumexp(wrong, dim=1)
    return torch.cat([correct.unsqueeze(1), wrong], dim=1), start_p


def policy_metrics(theta: torch.Tensor, start_p: torch.Tensor, ks: tuple[int, ...]) -> dict[str, Any]:
    """Exact Pass@k (``1 - (1 - p)^k`` per question, averaged) and mean entropy, overall and per bucket."""
    logp = torch.log_softmax(theta.detach().to(torch.float64), dim=1)
    p = logp[:, 0].exp()
    entropy = -(logp.exp() * logp).sum(dim=1)
    out: dict[str, Any] = {f"pass@{k}": (1 - (1 - p) ** k).mean().item() for k in ks}
    out["entropy"] = entropy.mean().item()
    for name, (low, high) in BUCKETS.items():
        mask = (start_p >= low) & (start_p < high)
        out[f"{name}/pass@1"] = p[mask].mean().item()
        out[f"{name}/pass@{ks[-1]}"] = (1 - (1 - p[mask]) ** ks[-1]).mean().item()
        out[f"{name}/entropy"] = entropy[mask].mean().item()
    return out


# --- advantages --------------------------------------------------------------------------------------------------


class AdvantageFn:
    """One method's advantage for a flat batch of ``P * G`` binary rewards, with its state (the trackers).

    The RiskPO variants go through the library's :class:`~riskpo_trl.risk.estimator.RiskEstimator`, the same object the
    trainer calls once per generation batch (bundling, tracker step, quantiles, advantage, credit rule)."""

    def __init__(self, method: str, cfg: TabularConfig, seed: int) -> None:
        if method not in (*METHODS, *EXTRA_METHODS):
            raise ValueError(f"Unknown method {method!r}; choose one of {(*METHODS, *EXTRA_METHODS)}.")
        self.method, self.cfg = method, cfg
        self.generator = torch.Generator().manual_seed(10_000 + seed)  # bundling draws, same for every method
        self.estimator = None
        if method != "grpo":
            extra = AUTHORS_ESTIMATOR if method == "riskpo_authors" else {"advantage_baseline": "none"}
            if method == "riskpo_loo":
                extra = {"advantage_baseline": "loo"}
            self.estimator = RiskEstimator(
                num_generations=cfg.num_generations,
                bundle_size=cfg.bundle_size,
                alpha=cfg.risk_alpha,
                beta=cfg.risk_beta,
                omega=cfg.authors_omega if method == "riskpo_authors" else cfg.risk_omega,
                risk_profile="risk_seeking" if method == "risk_seeking" else "mvar",
                quantile_lr=cfg.quantile_lr,
                **extra,
            )

    def __call__(self, rewards: torch.Tensor) -> torch.Tensor:
        if self.estimator is None:  # GRPO: TRL's group advantage
            grouped = rewards.view(-1, self.cfg.num_generations)
            mean, std = grouped.mean(dim=1, keepdim=True), grouped.std(dim=1, keepdim=True)
            return ((grouped - mean) / (std + 1e-4)).reshape(-1)
        return self.estimator.step(rewards, generator=self.generator, train=True).advantages.to(torch.float64)


def sample_batch(
    theta: torch.Tensor, num_prompts: int, num_generations: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(questions, answers, rewards)``, flat, ``G`` consecutive answers per question (TRL's layout)."""
    questions = torch.randperm(theta.shape[0], generator=gen)[:num_prompts].repeat_interleave(num_generations)
    probs = torch.softmax(theta.detach()[questions], dim=1)
    answers = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    return questions, answers, (answers == 0).to(torch.float64)


def logprob_advantage_cov(logp: torch.Tensor, adv: torch.Tensor, num_generations: int) -> float:
    """Mean over prompts of the within-group covariance of the sampled answers' log-prob and advantage."""
    lp, a = logp.view(-1, num_generations), adv.view(-1, num_generations)
    cov = ((lp - lp.mean(1, keepdim=True)) * (a - a.mean(1, keepdim=True))).sum(1) / (num_generations - 1)
    return cov.mean().item()


# --- training ----------------------------------------------------------------------------------------------------


def train(
    method: str,
    num_prompts: int,
    lr: float,
    seed: int,
    cfg: TabularConfig,
    steps: int | None = None,
    optimizer: str = "adam",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """One run; ``optimizer`` is ``"adam"`` (this study's) or ``"sgd"`` (plain steps, which keep the advantage's
    scale)."""
    theta0, start_p = starting_logits(cfg)
    theta = theta0.clone().requires_grad_(True)
    optimizer = OPTIMIZERS[optimizer]([theta], lr=lr)
    advantage = AdvantageFn(method, cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    curves: dict[str, list[float]] = {"step": [], "pass@1": [], "pass@16": [], "entropy": [], "hard/pass@16": []}
    covs: list[float] = []
    steps = cfg.steps if steps is None else steps
    for step in range(steps + 1):
        if step % cfg.curve_every == 0 or step == steps:
            m = policy_metrics(theta, start_p, cfg.ks)
            curves["step"].append(step)
            for key in ("pass@1", f"pass@{cfg.ks[-1]}", "entropy", f"hard/pass@{cfg.ks[-1]}"):
                curves[key.replace(str(cfg.ks[-1]), "16")].append(m[key])
        if step == steps:
            break
        questions, answers, rewards = sample_batch(theta, num_prompts, cfg.num_generations, gen)
        adv = advantage(rewards)
        logp = torch.log_softmax(theta[questions], dim=1).gather(1, answers.unsqueeze(1)).squeeze(1)
        covs.append(logprob_advantage_cov(logp.detach(), adv, cfg.num_generations))
        loss = -(adv * logp).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    final = policy_metrics(theta, start_p, cfg.ks)
    finite = [c for c in covs if math.isfinite(c)]
    mean_cov = sum(finite) / max(1, len(finite))
    return theta.detach(), {"final": final, "curves": curves, "mean_logprob_adv_cov": mean_cov}


def run_name(method: str, num_prompts: int, lr: float, seed: int) -> str:
    return f"{method}-P{num_prompts}-lr{lr:g}-seed{seed}"


def run_cell(
    path: Path, method: str, num_prompts: int, lr: float, seed: int, cfg: TabularConfig, optimizer: str | None = None
) -> None:
    """One run, written to ``path`` when it completes (``optimizer``: ``train``'s, recorded when given)."""
    started = time.perf_counter()
    _, result = train(method, num_prompts, lr, seed, cfg, **({"optimizer": optimizer} if optimizer else {}))
    recorded = {"optimizer": optimizer} if optimizer else {}
    result.update(
        method=method, prompts=num_prompts, lr=lr, seed=seed, **recorded, seconds=time.perf_counter() - started
    )
    write_json(path, result)


def jobs(cfg: TabularConfig, out_dir: Path, methods: list[str]) -> list[Job]:
    """Every (method, prompts, lr, seed), each cached as ``runs/<name>.json``."""
    return [
        Job(name, out_dir / "runs" / f"{name}.json", run_cell, (out_dir / "runs" / f"{name}.json", m, p, lr, s, cfg))
        for m in methods
        for p in cfg.prompts_per_step
        for lr in cfg.learning_rates
        for s in cfg.seeds
        if (name := run_name(m, p, lr, s))
    ]


def cached_runs(planned: list[Job]) -> dict[str, dict[str, Any]]:
    """Every run of ``planned``, by key; the report needs them all."""
    missing = [job.path for job in planned if not json_exists(job.path)]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} runs are not cached (the first: {missing[0]}); run the study without --report-only."
        )
    return {job.key: read_json(job.path) for job in planned}


# --- Proposition 1 -----------------------------------------------------------------------------------------------


def expected_advantage(theta: torch.Tensor, method: str, cfg: TabularConfig, seed: int = 0) -> torch.Tensor:
    """Monte Carlo estimate of ``A(x, y)``: the mean advantage the method gives answer ``y`` of question ``x``, over
    ``prop1_mc_batches`` batches of every question. A pair never sampled gets its question's mean advantage, so it
    adds nothing to the covariance (its policy weight is tiny anyway)."""
    advantage = AdvantageFn(method, cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    total = torch.zeros_like(theta, dtype=torch.float64)
    count = torch.zeros_like(total)
    for _ in range(cfg.prop1_mc_batches):
        questions, answers, rewards = sample_batch(theta, cfg.num_questions, cfg.num_generations, gen)
        adv = advantage(rewards)
        total.index_put_((questions, answers), adv, accumulate=True)
        count.index_put_((questions, answers), torch.ones_like(adv), accumulate=True)
    per_question = total.sum(1, keepdim=True) / count.sum(1, keepdim=True)
    return torch.where(count > 0, total / count.clamp(min=1), per_question.expand_as(total))


def entropy_rows(theta: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(theta.to(torch.float64), dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def proposition1(cfg: TabularConfig, methods: list[str]) -> dict[str, Any]:
    """Predicted ``-eta Cov(log pi, A)`` vs measured entropy change of a natural-gradient step, per question."""
    theta0, _ = starting_logits(cfg)
    trained, _ = train(
        "grpo", 50 if cfg.num_questions >= 50 else cfg.num_questions, 0.03, 0, cfg, steps=cfg.prop1_trained_steps
    )
    out: dict[str, Any] = {}
    for state_name, theta in (("start", theta0), ("grpo_trained", trained)):
        logp = torch.log_softmax(theta.to(torch.float64), dim=1)
        probs = logp.exp()
        h0 = entropy_rows(theta)
        out[state_name] = {}
        for method in methods:
            adv = expected_advantage(theta, method, cfg)
            centred_logp = logp - (probs * logp).sum(1, keepdim=True)
            centred_adv = adv - (probs * adv).sum(1, keepdim=True)
            cov = (probs * centred_logp * adv).sum(1)  # Cov_{y~pi}(log pi, A), one per question
            # The correlation is scale-free: advantages of different scales compare.
            corr = cov / ((probs * centred_logp**2).sum(1) * (probs * centred_adv**2).sum(1)).sqrt().clamp(min=1e-12)
            rows = {"cov": cov.tolist(), "corr": corr.tolist(), "etas": {}}
            for eta in cfg.prop1_etas:
                measured = entropy_rows(theta + eta * adv) - h0
                predicted = -eta * cov
                err = (measured - predicted).abs()
                rows["etas"][f"{eta:g}"] = {
                    "measured": measured.tolist(),
                    "predicted": predicted.tolist(),
                    "max_abs_error": err.max().item(),
                    "relative_error": (err.norm() / predicted.norm().clamp(min=1e-300)).item(),
                }
            rows["mean_cov"] = cov.mean().item()
            rows["mean_corr"] = corr.mean().item()
            out[state_name][method] = rows
    return out


# --- gradient diagnostics ----------------------------------------------------------------------------------------


def gradient_diagnostics(cfg: TabularConfig, methods: list[str]) -> dict[str, Any]:
    """At the starting policy: the batch policy gradient's signal-to-noise ratio ``|E g|^2 / E|g - E g|^2``, the mean
    cosine of a batch gradient with the exact gradient of the mean reward, and the share of the mean gradient's
    squared norm on each difficulty bucket. Scale-free, so advantages of different scales compare."""
    theta0, start_p = starting_logits(cfg)
    theta = theta0.clone().requires_grad_(True)
    exact = torch.autograd.grad(torch.softmax(theta, dim=1)[:, 0].mean(), theta)[0].reshape(-1)
    out = {}
    num_prompts = min(cfg.grad_prompts, cfg.num_questions)
    num_prompts -= num_prompts % cfg.bundle_size
    for method in methods:
        advantage = AdvantageFn(method, cfg, seed=0)
        gen = torch.Generator().manual_seed(0)
        grads = []
        for _ in range(cfg.grad_batches):
            questions, answers, rewards = sample_batch(theta, num_prompts, cfg.num_generations, gen)
            adv = advantage(rewards)
            logp = torch.log_softmax(theta[questions], dim=1).gather(1, answers.unsqueeze(1)).squeeze(1)
            grads.append(torch.autograd.grad((adv * logp).mean(), theta)[0].reshape(-1))
        g = torch.stack(grads)
        mean = g.mean(0)
        noise = (g - mean).pow(2).sum(1).mean()
        cosines = torch.nn.functional.cosine_similarity(g, exact.unsqueeze(0), dim=1)
        by_question = mean.view(cfg.num_questions, -1).pow(2).sum(1)
        share = {
            name: (by_question[(start_p >= lo) & (start_p < hi)].sum() / by_question.sum().clamp(min=1e-300)).item()
            for name, (lo, hi) in BUCKETS.items()
        }
        out[method] = {
            "snr": (mean.pow(2).sum() / noise.clamp(min=1e-300)).item(),
            "cosine_with_mean_reward_gradient": cosines.nan_to_num(0.0).mean().item(),
            "cosine_of_mean_gradient": torch.nn.functional.cosine_similarity(mean, exact, dim=0).item(),
            "gradient_share_by_bucket": share,
        }
    return out


# --- report ------------------------------------------------------------------------------------------------------


def summarize(cfg: TabularConfig, runs: dict[str, dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = {}
    keys = (
        [f"pass@{k}" for k in cfg.ks]
        + ["entropy"]
        + [f"{b}/{m}" for b in BUCKETS for m in ("pass@1", f"pass@{cfg.ks[-1]}", "entropy")]
    )
    for method in methods:
        for num_prompts in cfg.prompts_per_step:
            for lr in cfg.learning_rates:
                rs = [runs[run_name(method, num_prompts, lr, s)] for s in cfg.seeds]
                cell = {key: mean_std([r["final"][key] for r in rs]) for key in keys}
                cell["logprob_adv_cov"] = mean_std([r["mean_logprob_adv_cov"] for r in rs])
                cells[f"{method}|{num_prompts}|{lr:g}"] = cell
    selected = {}
    top = f"pass@{cfg.ks[-1]}"
    for method in methods:
        for num_prompts in cfg.prompts_per_step:
            best = max(
                cfg.learning_rates,
                key=lambda lr: (lambda c: (c["pass@1"][0] + c[top][0]) / 2)(cells[f"{method}|{num_prompts}|{lr:g}"]),
            )
            selected[f"{method}|{num_prompts}"] = best
    return {
        "cells": cells,
        "selected_lr": selected,
        "runs_seconds": [{"run": name, "seconds": r.get("seconds", 0.0)} for name, r in runs.items()],
    }


def plot_regime_map(cfg: TabularConfig, summary: dict[str, Any], methods: list[str], out: Path) -> Path:
    """Small multiples: for each method vs GRPO, the seed-mean difference in Pass@1, Pass@16, hard-bucket Pass@16
    and entropy over the (prompts per step, lr) grid."""
    plt = headless_pyplot()
    import numpy as np

    top = cfg.ks[-1]
    metrics = [
        ("pass@1", "Δ Pass@1"),
        (f"pass@{top}", f"Δ Pass@{top}"),
        (f"hard/pass@{top}", f"Δ hard Pass@{top}"),
        ("entropy", "Δ entropy"),
    ]
    others = [m for m in methods if m != "grpo"]
    fig, axes = plt.subplots(
        len(others) + 1, len(metrics), figsize=(3.3 * len(metrics), 2.7 * (len(others) + 1)), squeeze=False
    )
    cells = summary["cells"]
    for col, (key, title) in enumerate(metrics):
        for row, method in enumerate(["grpo", *others]):
            ax = axes[row][col]
            grid = np.array(
                [[cells[f"{method}|{p}|{lr:g}"][key][0] for lr in cfg.learning_rates] for p in cfg.prompts_per_step]
            )
            if method == "grpo":
                image, label = grid, title.replace("Δ ", "GRPO ")
                im = ax.imshow(image, cmap="viridis", aspect="auto")
            else:
                base = np.array(
                    [[cells[f"grpo|{p}|{lr:g}"][key][0] for lr in cfg.learning_rates] for p in cfg.prompts_per_step]
                )
                image, label = grid - base, f"{title}: {METHOD_LABELS[method]} - GRPO"
                lim = max(1e-6, float(np.abs(image).max()))
                im = ax.imshow(image, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
            for i in range(image.shape[0]):
                for j in range(image.shape[1]):
                    ax.text(
                        j,
                        i,
                        f"{image[i, j]:+.2f}" if method != "grpo" else f"{image[i, j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                    )
            ax.set_xticks(range(len(cfg.learning_rates)), [f"{lr:g}" for lr in cfg.learning_rates], fontsize=7)
            ax.set_yticks(range(len(cfg.prompts_per_step)), [str(p) for p in cfg.prompts_per_step], fontsize=7)
            ax.set_title(label, fontsize=7)
            if col == 0:
                ax.set_ylabel("prompts / step", fontsize=7)
            if row == len(others):
                ax.set_xlabel("Adam lr", fontsize=7)
            fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, out / "tabular_regime_map.png")


def plot_pass_at_k(cfg: TabularConfig, summary: dict[str, Any], methods: list[str], out: Path) -> Path:
    """Pass@k vs k for every cell (rows: prompts per step, columns: lr), one line per method (seed mean)."""
    plt = headless_pyplot()

    rows, cols = len(cfg.prompts_per_step), len(cfg.learning_rates)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.3 * rows), squeeze=False, sharey=True)
    theta0, start_p = starting_logits(cfg)
    start = policy_metrics(theta0, start_p, cfg.ks)
    for i, p in enumerate(cfg.prompts_per_step):
        for j, lr in enumerate(cfg.learning_rates):
            ax = axes[i][j]
            ax.plot(cfg.ks, [start[f"pass@{k}"] for k in cfg.ks], "k--", lw=1, label="start")
            for method in methods:
                cell = summary["cells"][f"{method}|{p}|{lr:g}"]
                ax.plot(cfg.ks, [cell[f"pass@{k}"][0] for k in cfg.ks], label=METHOD_LABELS[method], lw=1.2)
            ax.set_title(f"P={p}, lr={lr:g}", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=6)
    fig.supxlabel("k")
    fig.supylabel("Pass@k (exact)")
    return save_figure(fig, out / "tabular_pass_at_k.png")


MATCHED_PASS1_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9)


def matched_at_pass1(cfg: TabularConfig, runs: dict[str, dict[str, Any]], methods: list[str]) -> dict[str, Any]:
    """Entropy, Pass@16 and hard-bucket Pass@16 at the moment a cell's seed-mean Pass@1 curve first reaches each
    level (linear interpolation between logged points), averaged over the cells in which *every* method reaches it.
    Compares methods at equal Pass@1 on the same cells, rather than at equal learning rate, which mixes learning speed
    into the comparison. (An analysis added after the first results; it reads the same cached runs.)"""
    keys = ("entropy", "pass@16", "hard/pass@16")

    def crossing(method: str, num_prompts: int, lr: float, level: float) -> dict[str, float] | None:
        rs = [runs[run_name(method, num_prompts, lr, s)]["curves"] for s in cfg.seeds]
        mean = {k: [sum(r[k][i] for r in rs) / len(rs) for i in range(len(rs[0][k]))] for k in ("pass@1", *keys)}
        p1 = mean["pass@1"]
        for i in range(1, len(p1)):
            if p1[i - 1] < level <= p1[i]:
                w = (level - p1[i - 1]) / (p1[i] - p1[i - 1])
                return {k: mean[k][i - 1] + w * (mean[k][i] - mean[k][i - 1]) for k in keys}
        return None

    out: dict[str, Any] = {m: {} for m in methods}
    for level in MATCHED_PASS1_LEVELS:
        common = []
        for num_prompts in cfg.prompts_per_step:
            for lr in cfg.learning_rates:
                found = {m: crossing(m, num_prompts, lr, level) for m in methods}
                if all(v is not None for v in found.values()):
                    common.append(found)
        for m in methods:
            out[m][f"{level:g}"] = {
                "cells": len(common),
                **{k: (sum(c[m][k] for c in common) / len(common) if common else None) for k in keys},
            }
    return out


def plot_entropy_vs_pass1(cfg: TabularConfig, runs: dict[str, dict[str, Any]], methods: list[str], out: Path) -> Path:
    """Every cell's seed-mean trajectory in the (Pass@1, entropy) and (Pass@1, hard Pass@16) planes."""
    plt = headless_pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    colors = dict(zip(METHODS, ("C0", "C1", "C2", "C3")))
    for method in methods:
        for n, num_prompts in enumerate(cfg.prompts_per_step):
            for lr in cfg.learning_rates:
                rs = [runs[run_name(method, num_prompts, lr, s)]["curves"] for s in cfg.seeds]
                mean = {
                    k: [sum(r[k][i] for r in rs) / len(rs) for i in range(len(rs[0][k]))]
                    for k in ("pass@1", "entropy", "hard/pass@16")
                }
                label = METHOD_LABELS[method] if (n, lr) == (0, cfg.learning_rates[0]) else None
                axes[0].plot(mean["pass@1"], mean["entropy"], color=colors[method], lw=0.8, alpha=0.7, label=label)
                axes[1].plot(mean["pass@1"], mean["hard/pass@16"], color=colors[method], lw=0.8, alpha=0.7)
    axes[0].set_xlabel("Pass@1")
    axes[0].set_ylabel("mean entropy")
    axes[1].set_xlabel("Pass@1")
    axes[1].set_ylabel("hard-bucket Pass@16")
    axes[0].legend(fontsize=7)
    fig.suptitle("trajectories of every (prompts, lr) cell, seed mean", fontsize=9)
    return save_figure(fig, out / "tabular_entropy_vs_pass1.png")


def plot_proposition1(cfg: TabularConfig, prop1: dict[str, Any], methods: list[str], out: Path) -> Path:
    plt = headless_pyplot()

    eta = f"{cfg.prop1_etas[min(1, len(cfg.prop1_etas) - 1)]:g}"
    fig, axes = plt.subplots(1, len(prop1), figsize=(4.2 * len(prop1), 3.8), squeeze=False)
    for ax, (state, per_method) in zip(axes[0], prop1.items()):
        low, high = 0.0, 0.0
        for method in methods:
            e = per_method[method]["etas"][eta]
            ax.scatter(e["predicted"], e["measured"], s=6, alpha=0.6, label=METHOD_LABELS[method])
            low = min(low, *e["predicted"], *e["measured"])
            high = max(high, *e["predicted"], *e["measured"])
        ax.plot([low, high], [low, high], "k-", lw=0.8)
        ax.set_xlabel(f"predicted  -eta Cov(log pi, A), eta={eta}")
        ax.set_ylabel("measured entropy change")
        ax.set_title(f"Proposition 1, policy: {state}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    return save_figure(fig, out / "tabular_proposition1.png")


def markdown(
    cfg: TabularConfig,
    summary: dict[str, Any],
    prop1: dict[str, Any],
    grads: dict[str, Any],
    methods: list[str],
    matched: dict[str, Any],
) -> str:
    """The study's markdown report: the start, every cell, the chosen rates, the matched levels, Proposition 1, the
    gradient diagnostics and the timing."""
    top = cfg.ks[-1]
    theta0, start_p = starting_logits(cfg)
    start = policy_metrics(theta0, start_p, cfg.ks)
    lines = [
        "# Tabular study: GRPO vs RiskPO vs risk-seeking on a softmax policy",
        "",
        f"{cfg.num_questions} questions x {cfg.num_answers} answers, one correct; {cfg.steps} Adam steps, "
        f"G={cfg.num_generations}, seeds {list(cfg.seeds)} (mean ± std over seeds). Starting policy: Pass@1 "
        f"{start['pass@1']:.3f}, Pass@{top} {start[f'pass@{top}']:.3f}, entropy {start['entropy']:.3f}; hard bucket "
        f"(start P(correct) < 0.05, {int((start_p < 0.05).sum())} questions) Pass@{top} "
        f"{start[f'hard/pass@{top}']:.3f}.",
    ]
    lines += _cell_tables(cfg, summary, methods)
    lines += _matched_table(methods, matched)
    lines += _proposition1_table(cfg, prop1, methods)
    lines += _gradient_table(cfg, grads, methods)
    lines += _timing_note(summary)
    return "\n".join(lines)


def _cell_tables(cfg: TabularConfig, summary: dict[str, Any], methods: list[str]) -> list[str]:
    """Every cell's final policy, and the rate chosen per method and batch size."""
    top = cfg.ks[-1]
    lines = [
        "",
        "## Every cell (final policy)",
        "",
        f"| method | prompts | lr | Pass@1 | Pass@4 | Pass@{top} | hard Pass@{top} | easy Pass@1 | entropy | "
        "Cov(log pi, A) |",
        "|---" * 10 + "|",
    ]
    for method in methods:
        for p in cfg.prompts_per_step:
            for lr in cfg.learning_rates:
                c = summary["cells"][f"{method}|{p}|{lr:g}"]
                vals = [
                    c[k] for k in ("pass@1", "pass@4", f"pass@{top}", f"hard/pass@{top}", "easy/pass@1", "entropy")
                ]
                mark = " *" if summary["selected_lr"][f"{method}|{p}"] == lr else ""
                lines.append(
                    f"| {METHOD_LABELS[method]} | {p} | {lr:g}{mark} | "
                    + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in vals)
                    + f" | {c['logprob_adv_cov'][0]:+.3g} |"
                )
    lines += [
        "",
        "`*`: the lr chosen per method and batch size by the fixed rule (best seed-mean of "
        f"(Pass@1 + Pass@{top}) / 2).",
        "",
        "## Selected lr per method and batch size",
        "",
        "| prompts | " + " | ".join(METHOD_LABELS[m] for m in methods) + " |",
        "|---" * (len(methods) + 1) + "|",
    ]
    for p in cfg.prompts_per_step:
        cells = []
        for m in methods:
            lr = summary["selected_lr"][f"{m}|{p}"]
            c = summary["cells"][f"{m}|{p}|{lr:g}"]
            cells.append(
                f"lr {lr:g}: P@1 {c['pass@1'][0]:.3f}, P@{top} {c[f'pass@{top}'][0]:.3f}, H {c['entropy'][0]:.2f}"
            )
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def _matched_table(methods: list[str], matched: dict[str, Any]) -> list[str]:
    """Entropy and Pass@16 at equal Pass@1."""
    lines = [
        "",
        "## At equal Pass@1 (first crossing of each cell's seed-mean curve; mean over the cells where every "
        "method "
        "reaches the level)",
        "",
        "| method | "
        + " | ".join(f"Pass@1 = {lv:g}: entropy / Pass@16 / hard Pass@16 (cells)" for lv in MATCHED_PASS1_LEVELS)
        + " |",
        "|---" * (len(MATCHED_PASS1_LEVELS) + 1) + "|",
    ]
    for m in methods:
        cells = []
        for lv in MATCHED_PASS1_LEVELS:
            r = matched[m][f"{lv:g}"]
            cells.append(
                "not reached"
                if not r["cells"]
                else f"{r['entropy']:.2f} / {r['pass@16']:.3f} / {r['hard/pass@16']:.3f} ({r['cells']})"
            )
        lines.append(f"| {METHOD_LABELS[m]} | " + " | ".join(cells) + " |")
    return lines


def _proposition1_table(cfg: TabularConfig, prop1: dict[str, Any], methods: list[str]) -> list[str]:
    """Proposition 1's covariance and the natural-gradient step's error, per policy and method."""
    lines = [
        "",
        "## Proposition 1 (natural-gradient step, per question)",
        "",
        "| policy | method | mean Cov(log pi, A) | mean Corr(log pi, A) | "
        + " | ".join(f"rel. error eta={e:g}" for e in cfg.prop1_etas)
        + " |",
        "|---" * (4 + len(cfg.prop1_etas)) + "|",
    ]
    for state, per_method in prop1.items():
        for m in methods:
            r = per_method[m]
            lines.append(
                f"| {state} | {METHOD_LABELS[m]} | {r['mean_cov']:+.4f} | {r['mean_corr']:+.3f} | "
                + " | ".join(f"{r['etas'][f'{e:g}']['relative_error']:.2e}" for e in cfg.prop1_etas)
                + " |"
            )
    return lines


def _gradient_table(cfg: TabularConfig, grads: dict[str, Any], methods: list[str]) -> list[str]:
    """The gradient diagnostics at the starting policy."""
    lines = [
        "",
        f"## Gradient diagnostics at the starting policy ({cfg.grad_batches} batches of {cfg.grad_prompts} prompts)",
        "",
        "| method | SNR of batch gradient | mean cos(batch grad, grad of mean reward) | cos(mean grad, grad of "
        "mean reward) | share hard / medium / easy |",
        "|---|---|---|---|---|",
    ]
    for m in methods:
        g = grads[m]
        share = g["gradient_share_by_bucket"]
        lines.append(
            f"| {METHOD_LABELS[m]} | {g['snr']:.3f} | {g['cosine_with_mean_reward_gradient']:.3f} | "
            f"{g['cosine_of_mean_gradient']:.3f} | {share['hard']:.2f} / {share['medium']:.2f} / "
            f"{share['easy']:.2f} |"
        )
    return lines


def _timing_note(summary: dict[str, Any]) -> list[str]:
    """What the runs recorded of their own time."""
    run_seconds = sum(r.get("seconds", 0.0) for r in summary.get("runs_seconds", []))
    return [
        "",
        f"Timing: the {len(summary.get('runs_seconds', []))} training runs took {run_seconds:.0f} s in all, one "
        "torch thread each, on CPU cores shared with other jobs, as each run recorded it (`seconds` in its run "
        "file; `runs_seconds` in the JSON). The run files record neither the machine nor its load. Proposition 1 "
        "and the gradient diagnostics are recomputed by every report: their last digits depend on the CPU's "
        "vector kernels.",
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_study_args(study_parser(__doc__, "tabular", workers=0), argv)
    cfg = TabularConfig().scaled_down() if args.smoke else TabularConfig()
    out = args.out
    methods = list(METHODS)
    if not args.report_only:
        run_jobs(lambda: jobs(cfg, out, methods), args.workers, "tabular")
    runs = cached_runs(jobs(cfg, out, methods))
    summary = summarize(cfg, runs, methods)
    prop1 = proposition1(cfg, methods)
    grads = gradient_diagnostics(cfg, methods)
    figures = [
        plot_regime_map(cfg, summary, methods, out),
        plot_pass_at_k(cfg, summary, methods, out),
        plot_proposition1(cfg, prop1, methods, out),
        plot_entropy_vs_pass1(cfg, runs, methods, out),
    ]
    matched = matched_at_pass1(cfg, runs, methods)
    text = markdown(cfg, summary, prop1, grads, methods, matched)
    prop1_small = {
        s: {
            m: {
                "mean_cov": r["mean_cov"],
                "mean_corr": r["mean_corr"],
                "etas": {
                    e: {k: v for k, v in d.items() if k in ("max_abs_error", "relative_error")}
                    for e, d in r["etas"].items()
                },
            }
            for m, r in pm.items()
        }
        for s, pm in prop1.items()
    }
    payload = {
        "config": asdict(cfg),
        "methods": methods,
        **summary,
        "matched_at_pass1": matched,
        "proposition1": prop1_small,
        "gradient_diagnostics": grads,
        "figures": [f.name for f in figures],
    }
    write_results("tabular_study", payload, text, out)
    print(text)
    return payload


if __name__ == "__main__":
    main()
