"""Every figure the README quotes from the frontier study is the committed report's: each is rebuilt here from
benchmarks/results/lm_frontier/lm_frontier.json, so a README figure that no longer matches the report fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
REPORT = json.loads((ROOT / "benchmarks/results/lm_frontier/lm_frontier.json").read_text())
MARGIN = 0.01  # the pre-registered margin the README states
LABELS = {"riskpo_loo": "`loo` (the default)", "riskpo_authors": "The authors' advantage"}
LABELS["riskpo"] = "The paper's advantage"


def primary(start: str, variant: str) -> dict:
    [verdict] = [v for v in REPORT["starts"][start]["verdicts"] if v["variant"] == variant and v["role"] == "primary"]
    return verdict


def interval(difference: dict) -> str:
    return f"{difference['estimate']:+.3f} [{difference['low']:+.3f}, {difference['high']:+.3f}]"


def end_points(start: str, arm: str) -> str:
    values = REPORT["starts"][start]["end_points"][arm]
    return " / ".join(f"{values[k]:.4f}" for k in ("1", "64", "1024"))


def readme_text() -> str:
    return " ".join(README.split())  # lines rewrapped


@pytest.mark.parametrize("variant", sorted(LABELS))
def test_each_verdict_the_readme_quotes_is_the_reports(variant):
    moderate, low = primary("moderate", variant), primary("low", variant)
    line = next(line for line in README.splitlines() if line.strip().startswith(f"- {LABELS[variant]}:"))
    quoted = re.findall(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", line)
    assert quoted == [interval(moderate["difference"]), interval(low["difference"])], line
    for verdict in (moderate["verdict"], low["verdict"]):
        assert verdict in line
    assert abs(moderate["difference"]["low"]) < 1 and REPORT["complete"]


def test_the_edge_of_the_authors_low_start_verdict_is_the_reports():
    low = primary("low", "riskpo_authors")["difference"]["low"]
    inside = MARGIN - abs(low)
    assert 0 < inside < 0.0001  # what "only just" says
    assert f"its lower bound, {low:.5f}, is {inside:.5f} inside the margin" in readme_text()


def test_the_end_points_the_readme_quotes_are_the_reports():
    text = readme_text()
    for arm in ("grpo 1e-05", "riskpo_authors 1e-05", "riskpo_loo 1e-05"):
        assert end_points("low", arm) in text, arm
    finals = REPORT["starts"]["low"]["end_points"]
    best = max(finals, key=lambda arm: finals[arm]["64"])
    assert best == "grpo 1e-05"  # "GRPO's are the highest"
    assert all(finals["grpo 1e-05"][k] >= finals[arm][k] for arm in finals for k in ("64", "1024"))


def test_the_same_rate_gap_the_readme_quotes_is_the_reports():
    text = readme_text()
    for start in ("low", "moderate"):
        finals = REPORT["starts"][start]["end_points"]
        gap = finals["riskpo_loo 1e-05"]["64"] - finals["riskpo 1e-05"]["64"]
        assert f"{gap:+.3f} from the {start} start" in text, start


def test_only_grpo_and_loo_ran_at_two_rates():
    for start in ("moderate", "low"):
        rates = {}
        for arm in REPORT["starts"][start]["end_points"]:
            method, rate = arm.split(" ")
            rates.setdefault(method, set()).add(rate)
        assert {m for m, r in rates.items() if len(r) == 2} == {"grpo", "riskpo_loo"}
    assert "GRPO and `loo` ran at two learning rates" in readme_text()


@pytest.mark.parametrize("variant", sorted(LABELS))
def test_the_replication_pages_verdict_table_is_the_reports(variant):
    replication = (ROOT / "docs/replication.md").read_text()
    label = LABELS[variant][0].lower() + LABELS[variant][1:]
    [row] = [line for line in replication.splitlines() if line.startswith(f"| {label} | ") and "[" in line]
    quoted = re.findall(r"[+-]\d\.\d{3} \[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]", row)
    assert quoted == [interval(primary(start, variant)["difference"]) for start in ("moderate", "low")], row


def test_the_choosing_settings_figures_are_the_reports():
    training = " ".join((ROOT / "docs/training.md").read_text().split())
    section = training.split("## Choosing settings", 1)[1].split(" ## ", 1)[0]
    pairs = []
    for start in ("moderate", "low"):
        finals = REPORT["starts"][start]["end_points"]
        pairs.append(f"{finals['riskpo_loo 1e-05']['64']:.4f} against {finals['riskpo_loo 3e-05']['64']:.4f}")
        gap = finals["riskpo_loo 1e-05"]["64"] - finals["riskpo 1e-05"]["64"]
        assert f"{gap:+.3f} ({start} start)" in section, start
    assert f"({pairs[0]}, and {pairs[1]};" in section
