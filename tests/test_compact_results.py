"""The committed run results are compact (each run file gzip'd) and still hold what the reports are computed from: a
headline figure of the exact study recomputed from them equals the committed report's, and the one reader takes both
forms."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks._common import RESULTS_DIR, compact_json_files, json_exists, json_files, read_json

EXACT = RESULTS_DIR / "lm_exact"


def mean_test_pass_at_1(method: str, start: str = "moderate", seeds: range = range(5)) -> float:
    """Exact test Pass@1 (the mean success probability over the test problems), averaged over seeds."""
    per_seed = []
    for seed in seeds:
        path = EXACT / start / "runs" / f"{method}-lr3e-05-seed{seed}.json"
        assert not path.exists() and path.with_name(path.name + ".gz").exists(), path  # committed compact
        run = read_json(path)
        per_seed.append(np.concatenate([np.asarray(p, dtype=float) for p in run["test_p"].values()]).mean())
    return float(np.mean(per_seed))


def test_a_headline_figure_recomputes_from_the_compact_runs():
    """`RiskPO raises Pass@1 over GRPO` on the moderate start: the report's estimate is the difference of the two
    methods' mean exact test Pass@1 over 5 seeds and 300 problems."""
    report = json.loads((EXACT / "lm_exact.json").read_text())
    estimate = report["starts"]["moderate"]["gaps"]["riskpo-grpo"]["1"]["two_level"]["estimate"]
    assert mean_test_pass_at_1("riskpo") - mean_test_pass_at_1("grpo") == pytest.approx(estimate, abs=1e-12)


def test_the_reader_takes_both_forms_and_compacting_keeps_the_content(tmp_path: Path):
    payload = {"test": {"all": {"pass@1": 0.125}}, "curve": [0.1, 1.0000000000000002]}
    plain = tmp_path / "runs" / "a.json"
    plain.parent.mkdir()
    plain.write_text(json.dumps(payload) + "\n")
    (tmp_path / "runs" / "b.json").write_text("{}\n")
    assert read_json(plain) == payload and json_exists(plain)
    compact_json_files([plain])
    assert not plain.exists() and json_exists(plain) and read_json(plain) == payload
    assert json_files(tmp_path / "runs") == [plain, tmp_path / "runs" / "b.json"]  # by plain name, both forms
    first = plain.with_name("a.json.gz").read_bytes()
    assert gzip.decompress(first) == (json.dumps(payload) + "\n").encode()
    plain.with_name("a.json.gz").rename(tmp_path / "a.json.gz")
    assert not json_exists(plain)
    with pytest.raises(FileNotFoundError, match="a.json"):
        read_json(plain)
