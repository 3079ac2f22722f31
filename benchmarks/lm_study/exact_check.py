"""Exact evaluation checked against sampling on the committed starts: for a subset of test problems, the exact
success probability against the acceptance rate of many sampled completions (exact two-sided binomial test), and how
much more the old text grader accepts than the strict one.

    python -m benchmarks.lm_study.exact_check      # writes benchmarks/results/lm_exact/exact_check.{json,md}
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from .config import ExactProtocol
from .exact import sampled_acceptances, success_probabilities
from .starts import STARTS_DIR, checked_start
from .task import make_splits, prompt_of


def binomial_two_sided_p(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial test: the probability of a count at most as likely as ``k`` under Binomial(n, p)."""
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    if p >= 1.0:
        return 1.0 if k == n else 0.0

    def log_pmf(i: int) -> float:
        return (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * math.log(p)
            + (n - i) * math.log1p(-p)
        )

    observed = log_pmf(k)
    return min(1.0, sum(math.exp(log_pmf(i)) for i in range(n + 1) if log_pmf(i) <= observed + 1e-9))


def check_start(protocol: ExactProtocol, start_dir: Path, per_bucket: int, samples: int, seed: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = protocol.lm
    model = AutoModelForCausalLM.from_pretrained(start_dir)
    tokenizer = AutoTokenizer.from_pretrained(start_dir)
    splits = make_splits(cfg)
    pairs = [(d, a, b) for d, ps in splits.test.items() for a, b in ps[:per_bucket]]
    prompts, targets = [prompt_of(a, b) for _, a, b in pairs], [str(a + b) for _, a, b in pairs]
    exact = success_probabilities(
        model,
        tokenizer,
        prompts,
        targets,
        temperature=cfg.temperature,
        max_completion_length=cfg.max_completion_length,
    )
    counts = sampled_acceptances(
        model,
        tokenizer,
        prompts,
        targets,
        num_samples=samples,
        temperature=cfg.temperature,
        max_completion_length=cfg.max_completion_length,
        seed=seed,
    )
    rows = [
        {
            "bucket": d,
            "problem": prompt,
            "exact_p": p,
            "strict": k,
            "text": t,
            "binomial_p_value": binomial_two_sided_p(k, samples, p),
        }
        for (d, _, _), prompt, p, k, t in zip(pairs, prompts, exact, counts["strict"], counts["text"])
    ]
    return {
        "samples_per_problem": samples,
        "seed": seed,
        "problems": rows,
        "min_p_value": min(r["binomial_p_value"] for r in rows),
        "mean_exact_p": sum(exact) / len(exact),
        "mean_sampled_rate": sum(counts["strict"]) / (samples * len(rows)),
        "text_only_accepted_share": (sum(counts["text"]) - sum(counts["strict"])) / (samples * len(rows)),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-bucket", type=int, default=10, help="Test problems per bucket (the first ones).")
    parser.add_argument("--samples", type=int, default=2000, help="Sampled completions per problem.")
    parser.add_argument("--out", type=Path, default=STARTS_DIR.parent, help="Where exact_check.{json,md} go.")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    protocol = ExactProtocol()
    result = {
        start: check_start(protocol, checked_start(STARTS_DIR / start), args.per_bucket, args.samples, seed=i)
        for i, start in enumerate(("low", "moderate"))
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exact_check.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Exact evaluation against sampling (committed starts)",
        "",
        f"First {args.per_bucket} test problems per bucket, {args.samples} sampled completions each (temperature "
        f"{protocol.lm.temperature}, whole vocabulary, as in training). A two-sided exact binomial test of the "
        "sampled count against the exact probability, per problem.",
        "",
        "| start | problems | smallest binomial p-value | mean exact p | mean sampled rate | "
        "sampled completions the text grader accepts and the strict one does not |",
        "|---|---|---|---|---|---|",
    ]
    for start, r in result.items():
        lines.append(
            f"| {start} | {len(r['problems'])} | {r['min_p_value']:.3f} | {r['mean_exact_p']:.4f} | "
            f"{r['mean_sampled_rate']:.4f} | {r['text_only_accepted_share']:.5f} |"
        )
    (args.out / "exact_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    main()
