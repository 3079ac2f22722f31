"""The exact protocol's verdict rule applied, after the fact, to the long protocol's cached runs (sampled evaluation:
64 completions per test problem, one evaluation seed shared by every run).

Per problem, Pass@k is the unbiased estimate from its count of correct samples (k <= 64), so this carries the
sampling noise the exact protocol removes; the rows are a labelled record, not the new results.

    python -m benchmarks.lm_study.long_record_stats    # writes benchmarks/results/lm_long/lm_long_bootstrap.{md,json}
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import RESULTS_DIR, read_json

from .config import EXACT_CLAIMS, EXACT_VERDICT_RULE, Claim, ExactProtocol
from .stats import paired_problem_bootstrap, two_level_bootstrap, verdict

BUCKETS = ("2digit", "3digit", "4digit")
SAMPLES = 64
RECORD_SEEDS = (0, 1, 2)


def unbiased_pass_at_k(counts: list[int], n: int, k: int) -> np.ndarray:
    """Per problem, 1 - C(n - c, k) / C(n, k)."""
    return np.array([1.0 - math.comb(n - c, k) / math.comb(n, k) for c in counts])


def values(entry: dict[str, Any], claim: Claim, k: int) -> np.ndarray:
    if claim.metric == "entropy":
        return np.array([entry["all"]["entropy"]])
    buckets = [f"{claim.bucket}digit"] if claim.bucket else BUCKETS
    counts = [c for b in buckets for c in entry[b]["counts"]]
    if claim.metric == "widening":
        return unbiased_pass_at_k(counts, SAMPLES, k) - unbiased_pass_at_k(counts, SAMPLES, 1)
    return unbiased_pass_at_k(counts, SAMPLES, k)


def record_rows(out: Path, protocol: ExactProtocol) -> list[dict[str, Any]]:
    rows = []
    for start in protocol.starts:
        start_test = read_json(out / start / "start_eval.json")["test"]
        for claim in EXACT_CLAIMS:
            k = min(claim.k, SAMPLES)
            if claim.k > SAMPLES and any(
                c.k == SAMPLES and (c.a, c.b, c.metric, c.bucket) == (claim.a, claim.b, claim.metric, claim.bucket)
                for c in EXACT_CLAIMS
            ):
                continue  # the same row as the k = 64 one

            def matrix(who: str, start: str, start_test: dict, claim: Claim, k: int) -> np.ndarray:
                if who == "start":
                    return values(start_test, claim, k)[None, :]
                lr = protocol.lr(start, who)
                runs = [read_json(out / start / "runs" / f"{who}-lr{lr:g}-seed{s}.json")["test"] for s in RECORD_SEEDS]
                return np.array([values(r, claim, k) for r in runs])

            a, b = (matrix(who, start, start_test, claim, k) for who in (claim.a, claim.b))
            kwargs = {"resamples": protocol.bootstrap_resamples, "seed": protocol.bootstrap_seed}
            two = two_level_bootstrap(a, b, **kwargs)
            one = paired_problem_bootstrap(a, b, **kwargs) if claim.metric != "entropy" else None
            label = claim.label.replace("1024", "64") if claim.k > SAMPLES else claim.label
            rows.append(
                {
                    "start": start,
                    "claim": label,
                    "k": k,
                    "two_level": two.as_dict(),
                    "problem_level": one.as_dict() if one else None,
                    "verdict": verdict(two, claim.sign),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "lm_long", help="The long protocol's folder.")
    args = parser.parse_args(argv)
    rows = record_rows(args.out, ExactProtocol())
    lines = [
        "# The long protocol's runs under the exact protocol's verdict rule (a record; sampled evaluation)",
        "",
        "Runs: each method at its chosen lr, seeds 0-2, both starts (the long protocol's own starts, not the "
        "exact protocol's). Per problem, the unbiased Pass@k from 64 sampled completions (k <= 64: rows about "
        "k = 1024 use k = 64); every run was evaluated with the same sampling seed. "
        f"Rule: {EXACT_VERDICT_RULE}",
        "",
        "| start | claim | difference [95% two-level CI] | problem-level CI | verdict by the rule |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        t, o = row["two_level"], row["problem_level"]
        lines.append(
            f"| {row['start']} | {row['claim']} | {t['estimate']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}] | "
            + (f"[{o['low']:+.4f}, {o['high']:+.4f}]" if o else "(seed level only)")
            + f" | {row['verdict']} |"
        )
    (args.out / "lm_long_bootstrap.md").write_text("\n".join(lines) + "\n")
    (args.out / "lm_long_bootstrap.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return rows


if __name__ == "__main__":
    main()
