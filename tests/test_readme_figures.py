"""Every figure the docs quote from the frontier study is the committed report's: each is rebuilt here from
benchmarks/results/lm_frontier/lm_frontier.json, so a quoted figure that no longer matches the report fails. The
README states the verdict and links to docs/replication.md, where the intervals live."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
REPLICATION = (ROOT / "docs/replication.md").read_text()
REPORT = json.loads((ROOT / "benchmarks/results/lm_frontier/lm_frontier.json").read_text())
MARGIN = 0.01  # the pre-registered margin the docs state
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


def replication_text() -> str:
    return " ".join(REPLICATION.split())


def readme_section() -> str:
    return README.split("## When does RiskPO help?", 1)[1].split("\n## ", 1)[0]


def test_the_readme_states_the_verdict_in_a_few_lines_and_quotes_no_interval():
    section = readme_section()
    assert len(section.strip().splitlines()) <= 20
    assert not re.findall(r"[+-]\d\.\d{3} \[", section)  # the intervals live in docs/replication.md
    assert "docs/replication.md" in section and "±0.01 of Pass@64" in " ".join(section.split())


@pytest.mark.parametrize("variant", sorted(LABELS))
def test_each_verdict_the_readme_states_is_the_reports(variant):
    verdicts = [primary(start, variant)["verdict"] for start in ("moderate", "low")]
    text = " ".join(readme_section().split())
    if variant == "riskpo":
        assert sorted(verdicts) == ["equivalent", "undecided"]
        assert "the paper's advantage is equivalent from one start and undecided, below GRPO, from the other" in text
        assert primary("low", variant)["difference"]["estimate"] < 0  # "below GRPO"
    else:
        assert verdicts == ["equivalent", "equivalent"]
        assert "The default, `loo`, and the authors' advantage are equivalent to GRPO" in text
    assert abs(primary("moderate", variant)["difference"]["low"]) < 1 and REPORT["complete"]


def test_the_edge_of_the_authors_low_start_verdict_is_the_reports():
    low = primary("low", "riskpo_authors")["difference"]["low"]
    inside = MARGIN - abs(low)
    assert 0 < inside < 0.0001  # what "only just" says
    assert f"its lower bound, {low:.5f}, is {inside:.5f} inside the margin" in replication_text()


def test_the_end_points_the_docs_quote_are_the_reports():
    text = replication_text()
    for arm in ("riskpo_authors 1e-05", "riskpo_loo 1e-05"):
        assert end_points("low", arm) in text, arm
    grpo = REPORT["starts"]["low"]["end_points"]["grpo 1e-05"]
    assert f"(Pass@1 {grpo['1']:.4f}, Pass@64 {grpo['64']:.4f}, Pass@1,024 {grpo['1024']:.4f};" in text
    finals = REPORT["starts"]["low"]["end_points"]
    best = max(finals, key=lambda arm: finals[arm]["64"])
    assert best == "grpo 1e-05"  # "GRPO's are the highest"
    assert all(finals["grpo 1e-05"][k] >= finals[arm][k] for arm in finals for k in ("64", "1024"))


def post_hoc_end_point(start: str, arm: str, against: str) -> dict:
    [row] = [
        r for r in REPORT["starts"][start]["post_hoc"]["end_points"] if (r["arm"], r["against"]) == (arm, against)
    ]
    return row["differences"]["64"]


def post_hoc_beyond(start: str, variant: str) -> dict | None:
    [row] = [
        r for r in REPORT["starts"][start]["post_hoc"]["beyond_interval"] if (r["variant"], r["k"]) == (variant, 64)
    ]
    return row["difference"]


def flipped(difference: dict) -> str:
    """A negative difference quoted the other way round: reference minus arm."""
    return f"{-difference['estimate']:.3f} [{-difference['high']:.3f}, {-difference['low']:.3f}]"


def test_the_same_rate_gap_and_its_ci_are_the_reports():
    replication = " ".join((ROOT / "docs/replication.md").read_text().split())
    for start in ("low", "moderate"):
        finals = REPORT["starts"][start]["end_points"]
        gap = finals["riskpo_loo 1e-05"]["64"] - finals["riskpo 1e-05"]["64"]
        difference = post_hoc_end_point(start, "riskpo_loo 1e-05", "riskpo 1e-05")
        assert abs(difference["estimate"] - gap) < 1e-12  # the post hoc row is the end points' difference
        assert f"{interval(difference)} from the {start} start" in replication, start
    low, moderate = (post_hoc_end_point(s, "riskpo_loo 1e-05", "riskpo 1e-05") for s in ("low", "moderate"))
    assert (
        low["low"] > 0 and moderate["low"] < 0 < moderate["high"]
    )  # "ahead from the low start, level from the other"
    assert "ahead from the low start, level from the moderate one" in replication


def test_the_post_hoc_figures_past_the_interval_are_the_reports():
    replication = replication_text()
    for variant in ("riskpo_loo", "riskpo_authors"):
        d = post_hoc_beyond("low", variant)
        assert d["high"] < 0  # "below GRPO's"
        quoted = f"{interval(d)} over {'Pass@1 ' if variant == 'riskpo_loo' else ''}"
        quoted += f"{d['levels'][0]:.3f}-{d['levels'][-1]:.3f}"
        assert quoted in replication, variant
    assert post_hoc_beyond("low", "riskpo")["estimate"] is None  # "reaches no Pass@1 above the interval"
    for arm, name in (("riskpo_loo 1e-05", "`loo`'s"), ("riskpo_authors 1e-05", "the authors' advantage")):
        d = post_hoc_end_point("low", arm, "grpo 1e-05")
        assert d["high"] < 0 and flipped(d) in replication, arm


def test_the_post_hoc_section_is_labelled_and_after_the_verdicts():
    report = (ROOT / "benchmarks/results/lm_frontier/lm_frontier.md").read_text()
    for section in report.split("## Start ")[1:]:
        verdicts = section.index("### Verdicts")
        post_hoc = section.index("### Post hoc (not pre-registered, descriptive)")
        assert verdicts < post_hoc and "not pre-registered, no rule applies, no verdict is given" in section[post_hoc:]
        assert "verdict" not in section[post_hoc:].split("\n", 3)[3].lower()  # no verdict column after the note


def test_only_grpo_and_loo_ran_at_two_rates():
    for start in ("moderate", "low"):
        rates = {}
        for arm in REPORT["starts"][start]["end_points"]:
            method, rate = arm.split(" ")
            rates.setdefault(method, set()).add(rate)
        assert {m for m, r in rates.items() if len(r) == 2} == {"grpo", "riskpo_loo"}
    assert "GRPO and `loo` ran at two rates" in replication_text()


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
