"""Throughput of RiskPO's advantage computation: bundling, the quantile-tracker step and the MVaR advantages.

    python -m benchmarks.advantage_throughput                      # 10k, 100k, 1M, 4M completions, G=16, B=5
    python -m benchmarks.advantage_throughput --sizes 1000000 --repeats 20

Each size is timed end to end (what ``RiskPOTrainer`` does per generation batch: ``permutation_bundles``, then
``QuantileTracker.update`` on the bundle scores, then ``riskpo_advantages`` reusing the bundles) and per stage, as the
median over ``--repeats`` runs after ``--warmup`` untimed ones. Rewards are i.i.d. Bernoulli(0.5), like a binary
verifier's; the cost does not depend on the values.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks._common import machine_info, write_results
from riskpo_trl.risk import permutation_bundles, riskpo_advantages
from riskpo_trl.risk.quantile_tracker import QuantileTracker

TARGET_MS_PER_MILLION = 100.0


def timings_ms(fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def median_ms(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    return statistics.median(timings_ms(fn, repeats, warmup))


def time_size(
    num_completions: int, num_generations: int, bundle_size: int, repeats: int, warmup: int, device: str
) -> dict[str, float]:
    """Median milliseconds of each stage and of the whole advantage step for one batch size."""
    group = num_generations * bundle_size
    if num_completions % group:
        raise ValueError(
            f"--sizes entry {num_completions} is not a multiple of num_generations * bundle_size = {group}; every "
            "bundle needs one completion from each of bundle_size prompts."
        )
    generator = torch.Generator().manual_seed(0)
    rewards = torch.bernoulli(torch.full((num_completions,), 0.5), generator=generator).to(device)
    tracker = QuantileTracker([0.2, 0.8], lr=0.1)
    bundles = permutation_bundles(rewards, num_generations, bundle_size, generator)
    tracker.update(bundles[0])  # warm start, so the timed updates take the stochastic-approximation branch
    q_alpha, q_beta = tracker.values.tolist()

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def bundle() -> None:
        permutation_bundles(rewards, num_generations, bundle_size, generator)
        sync()

    def track() -> None:
        tracker.update(bundles[0])

    def advantages() -> None:
        riskpo_advantages(
            rewards,
            num_generations=num_generations,
            bundle_size=bundle_size,
            q_alpha=q_alpha,
            q_beta=q_beta,
            omega=0.5,
            advantage_baseline="none",
            bundles=bundles,
        )
        sync()

    def full_step() -> None:
        fresh = permutation_bundles(rewards, num_generations, bundle_size, generator)
        q = tracker.update(fresh[0]).tolist()
        riskpo_advantages(
            rewards,
            num_generations=num_generations,
            bundle_size=bundle_size,
            q_alpha=q[0],
            q_beta=q[1],
            omega=0.5,
            advantage_baseline="none",
            bundles=fresh,
        )
        sync()

    totals = timings_ms(full_step, repeats, warmup)
    return {
        "completions": num_completions,
        "permutation_bundles_ms": median_ms(bundle, repeats, warmup),
        "tracker_update_ms": median_ms(track, repeats, warmup),
        "riskpo_advantages_ms": median_ms(advantages, repeats, warmup),
        "total_ms": statistics.median(totals),
        "total_min_ms": min(totals),  # the least disturbed run: a bound on what other load added
    }


def profile_lines(num_completions: int, num_generations: int, bundle_size: int, repeats: int, warmup: int) -> dict:
    """Median cost of each line of the advantage step, timed in sequence inside one call (so allocation and cache
    effects land where they occur). The body re-states ``permutation_bundles``, ``QuantileTracker.update`` and
    ``riskpo_advantages`` line by line; keep it in step with ``riskpo_trl.risk``. CPU only."""
    from riskpo_trl.risk import mvar_advantage

    generator = torch.Generator().manual_seed(0)
    rewards = torch.bernoulli(torch.full((num_completions,), 0.5), generator=generator)
    num_prompts = num_completions // num_generations
    num_bundles = num_prompts // bundle_size * num_generations
    tracker = QuantileTracker([0.2, 0.8])
    tracker.update(torch.randint(0, bundle_size + 1, (num_bundles,), generator=generator).double())
    times: dict[str, list[float]] = {}

    def step() -> None:
        clock = [time.perf_counter()]

        def lap(name: str) -> None:
            now = time.perf_counter()
            times.setdefault(name, []).append(now - clock[0])
            clock[0] = now

        keys = torch.rand(num_prompts, num_generations, generator=generator, dtype=torch.float64)
        lap("bundles: torch.rand float64 keys")
        slot = keys.argsort(dim=1)
        lap("bundles: keys.argsort(dim=1)")
        group = torch.arange(num_prompts) // bundle_size
        bundle_ids = (group.unsqueeze(1) * num_generations + slot).reshape(-1)
        lap("bundles: bundle_ids")
        values = rewards.to(torch.float64)
        scorable = ~torch.isnan(values)
        lap("bundles: to(float64), isnan")
        sums = torch.zeros(num_bundles, dtype=torch.float64)
        sums.index_add_(0, bundle_ids, torch.where(scorable, values, torch.zeros_like(values)))
        lap("bundles: where + index_add_ (sums)")
        counts = torch.zeros(num_bundles, dtype=torch.float64)
        counts.index_add_(0, bundle_ids, scorable.to(torch.float64))
        lap("bundles: index_add_ (counts)")
        scores = torch.where(counts == bundle_size, sums, sums * bundle_size / counts).to(torch.float32)
        lap("bundles: rescale partial bundles")
        q_alpha, q_beta = tracker.update(scores).tolist()
        lap("QuantileTracker.update")
        bundle_adv = mvar_advantage(scores.to(torch.float64), q_alpha, q_beta, 0.5)
        lap("advantages: mvar_advantage on bundles")
        advantages = bundle_adv[bundle_ids]
        lap("advantages: bundle_adv[bundle_ids]")
        advantages = torch.where(torch.isnan(rewards), torch.zeros_like(advantages), advantages)
        lap("advantages: where(isnan(rewards), 0, .)")
        torch.nan_to_num(advantages, nan=0.0, posinf=0.0, neginf=0.0).to(torch.float32)
        lap("advantages: nan_to_num, to(float32)")

    median_ms(step, repeats, warmup)
    profile = {name: 1e3 * statistics.median(values[warmup:]) for name, values in times.items()}
    profile["sum of lines"] = sum(profile.values())
    return profile


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=[10_000, 100_000, 1_000_000, 4_000_000],
        help="Completions per batch; each a multiple of num_generations * bundle_size.",
    )
    parser.add_argument("--num-generations", type=int, default=16)
    parser.add_argument("--bundle-size", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: the single-core cost, robust on a shared machine).",
    )
    parser.add_argument("--device", default="cpu", help="'cpu' or 'cuda' (the tracker always works on CPU).")
    parser.add_argument("--out", default=None, help="Results directory (default: benchmarks/results).")
    parser.add_argument(
        "--profile",
        type=int,
        default=1_000_000,
        metavar="N",
        help="Also time each line of the core functions at N completions on CPU (0: skip).",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    rows = [
        time_size(n, args.num_generations, args.bundle_size, args.repeats, args.warmup, args.device)
        for n in args.sizes
    ]
    for row in rows:
        row["ms_per_million"] = row["total_ms"] * 1e6 / row["completions"]
    lines = [
        (
            f"# Advantage throughput (G={args.num_generations}, B={args.bundle_size}, device={args.device}, "
            f"{args.threads} thread(s); median of {args.repeats} after {args.warmup} warm-up)"
        ),
        "",
        (
            "| completions | permutation_bundles | tracker.update | riskpo_advantages | total | total per 1M | "
            "fastest total per 1M |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['completions']:,} | {r['permutation_bundles_ms']:.2f} ms | {r['tracker_update_ms']:.2f} ms | "
            f"{r['riskpo_advantages_ms']:.2f} ms | {r['total_ms']:.2f} ms | {r['ms_per_million']:.1f} ms | "
            f"{r['total_min_ms'] * 1e6 / r['completions']:.1f} ms |"
        )
    lines += ["", f"Target: < {TARGET_MS_PER_MILLION:.0f} ms per million completions."]
    payload = {
        "machine": machine_info(),
        "args": vars(args),
        "results": rows,
        "target_ms_per_million": TARGET_MS_PER_MILLION,
    }
    if args.profile:
        profile = profile_lines(args.profile, args.num_generations, args.bundle_size, args.repeats, args.warmup)
        payload["line_profile_ms"] = profile
        lines += [
            "",
            f"Line profile at {args.profile:,} completions (median ms):",
            "",
            "| operation | ms |",
            "|---|---:|",
        ]
        lines += [f"| {name} | {ms:.2f} |" for name, ms in profile.items()]
    markdown = "\n".join(lines)
    write_results("advantage_throughput", payload, markdown, args.out)
    print(markdown)
    return payload


if __name__ == "__main__":
    main()
