"""The committed run results are compact (one pack per study, `benchmarks.store`) and still hold what the reports are
computed from: a headline figure of the exact study recomputed from the pack equals the committed report's, and the
one reader takes every form (loose plain, loose gzip'd, packed), a loose file winning over its packed copy."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import store
from benchmarks._common import RESULTS_DIR, compact_json_files, json_exists, json_files, read_json

EXACT = RESULTS_DIR / "lm_exact"


def mean_test_pass_at_1(method: str, start: str = "moderate", seeds: range = range(5)) -> float:
    """Exact test Pass@1 (the mean success probability over the test problems), averaged over seeds."""
    per_seed = []
    for seed in seeds:
        path = EXACT / start / "runs" / f"{method}-lr3e-05-seed{seed}.json"
        assert store.find_packed(path) is not None, f"{path} is not in the study's pack"
        run = read_json(path)
        per_seed.append(np.concatenate([np.asarray(p, dtype=float) for p in run["test_p"].values()]).mean())
    return float(np.mean(per_seed))


def test_a_headline_figure_recomputes_from_the_packed_runs():
    """`RiskPO raises Pass@1 over GRPO` on the moderate start: the report's estimate is the difference of the two
    methods' mean exact test Pass@1 over 5 seeds and 300 problems."""
    report = json.loads((EXACT / "lm_exact.json").read_text())
    estimate = report["starts"]["moderate"]["gaps"]["riskpo-grpo"]["1"]["two_level"]["estimate"]
    assert mean_test_pass_at_1("riskpo") - mean_test_pass_at_1("grpo") == pytest.approx(estimate, abs=1e-12)


def test_the_readme_recipe_reads_every_pack_without_this_repository():
    """The recipe in benchmarks/results/README.md (plain pyarrow, numpy and json) reads every committed pack, its runs
    equal to the reader's, and the packs use every kind of marker it decodes."""
    readme = (RESULTS_DIR / "README.md").read_text()
    recipe = readme.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(recipe, namespace)
    packs = sorted(RESULTS_DIR.glob(f"*/{store.PACK_NAME}"))
    assert len(packs) >= 8
    markers = set()
    for pack in packs:
        runs = namespace["read_pack"](pack)
        for name in sorted(runs)[:3]:  # three runs a pack keep the test quick; the recipe decodes them all
            assert json.dumps(runs[name]) == json.dumps(read_json(pack.parent / name)), (pack, name)
        for text in pq_column(pack, "json"):
            markers |= {m for m in ("$i64", "$f32", "$dec", "$f64", "$rows") if f'"{m}"' in text}
    assert markers == {"$i64", "$f32", "$dec", "$f64", "$rows"}


def pq_column(path: Path, column: str) -> list:
    import pyarrow.parquet as pq

    return pq.read_table(path, columns=[column]).column(column).to_pylist()


# Every kind of value a run holds: ints, float32-exact floats, rounded decimals, full doubles, NaN and -0.0,
# None, nested records with the same keys (stored column by column), short lists, empty containers, key order.
RUN = {
    "z_first": 1,
    "method": "grpo",
    "lr": 3e-05,
    "ints": list(range(-3, 17)),
    "f32": [float(np.float32(x)) for x in np.linspace(-2, 3, 20)],
    "decimals": [0.464992, 2.31e-05, 0.0001, 123.5, 1e-22, 0.5, 0.25, 7.0, 3.0, 0.1],
    "doubles": [math.pi * k for k in range(1, 11)],
    "odd": [float("nan"), -0.0, float("inf"), 1.0, 2.0, 3.0, 4.0, 5.0],
    "mixed": [0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, None],
    "records": [{"q": 0.1 * i, "n": i, "maybe": None if i % 2 else 0.5} for i in range(12)],
    "short": [1.5, 2],
    "empty": {"list": [], "dict": {}},
    "nested": {"test_p": {"2digit": [i / 7 for i in range(30)]}},
}


def test_packing_keeps_every_value_exactly(tmp_path: Path):
    runs = tmp_path / "study" / "low" / "runs"
    runs.mkdir(parents=True)
    (runs / "a.json").write_text(json.dumps(RUN))
    store.pack(tmp_path / "study")
    assert not (runs / "a.json").exists() and (tmp_path / "study" / store.PACK_NAME).exists()
    back = read_json(runs / "a.json")
    assert json.dumps(back) == json.dumps(RUN)  # same text: key order, ints against floats, every float's digits
    assert [type(v) for v in back["mixed"]] == [type(v) for v in RUN["mixed"]]
    assert math.copysign(1, back["odd"][1]) == -1


def test_a_packed_run_counts_as_cached_and_a_later_loose_file_is_read(tmp_path: Path):
    study = tmp_path / "study"
    runs = study / "moderate" / "runs"
    runs.mkdir(parents=True)
    (runs / "a.json").write_text(json.dumps({"seed": 0, "score": 0.25}))
    compact_json_files([runs / "a.json"])  # a gzip'd loose file folds in too
    (runs / "b.json").write_text(json.dumps({"seed": 1, "score": 0.5}))
    store.pack(study)
    assert json_exists(runs / "a.json") and json_exists(runs / "b.json") and not list(runs.iterdir())
    assert not json_exists(runs / "c.json")
    # A run arriving later as a loose file (plain or gzip'd) is listed and read; a loose file wins over the pack.
    (runs / "c.json").write_text(json.dumps({"seed": 2, "score": 0.75}))
    (runs / "b.json").write_text(json.dumps({"seed": 1, "score": 0.0, "rerun": True}))
    compact_json_files([runs / "b.json"])
    assert json_files(runs) == [runs / "a.json", runs / "b.json", runs / "c.json"]
    assert read_json(runs / "c.json")["score"] == 0.75 and read_json(runs / "b.json")["rerun"] is True
    # Packing again folds the loose files in; the packed copy of b is replaced by its loose one.
    done = store.pack(study)
    assert (done["runs"], done["loose"]) == (3, 2) and not list(runs.iterdir())
    assert [read_json(runs / f"{n}.json")["score"] for n in "abc"] == [0.25, 0.0, 0.75]
    with pytest.raises(FileNotFoundError, match="d.json"):
        read_json(runs / "d.json")


def test_pack_drops_only_the_fields_named_and_records_them(tmp_path: Path):
    runs = tmp_path / "runs"
    runs.mkdir()
    run = {"curves": {"entropy": [0.5] * 10}, "batch": [{"keep": 1, "drop": 2}] * 9, "test_p": [0.25] * 10}
    (runs / "a.json").write_text(json.dumps(run))
    store.pack(tmp_path, drop=["curves", "batch.[].drop"])
    assert read_json(runs / "a.json") == {"batch": [{"keep": 1}] * 9, "test_p": [0.25] * 10}
    assert store.open_pack(tmp_path / store.PACK_NAME).dropped == ["batch.[].drop", "curves"]


def test_a_pack_that_would_not_read_back_exactly_is_not_written(tmp_path: Path, monkeypatch):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "a.json").write_text(json.dumps(RUN))
    real = store.decode_run
    monkeypatch.setattr(store, "decode_run", lambda row: {**real(row), "lr": 3.0000000000000004e-05})  # lossy
    with pytest.raises(AssertionError, match="does not decode to the same JSON"):
        store.pack(tmp_path)
    assert (runs / "a.json").exists() and not (tmp_path / store.PACK_NAME).exists()


def test_a_reserved_key_is_refused(tmp_path: Path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text(json.dumps({"$f64": 0}))
    with pytest.raises(ValueError, match=r"key starting with '\$'"):
        store.pack(tmp_path)


def test_the_pack_command(tmp_path: Path, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.json").write_text(json.dumps({"x": [1.5] * 20}))
    store.main(["pack", str(tmp_path)])
    assert "1 runs (1 loose folded in)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        store.main(["pack", str(tmp_path / "missing")])
    assert "error: " in capsys.readouterr().err


def test_the_reader_takes_both_loose_forms_and_compacting_keeps_the_content(tmp_path: Path):
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


def test_save_figure_writes_a_light_png_that_looks_the_same(tmp_path: Path):
    import io

    from PIL import Image

    from benchmarks._common import headless_pyplot, light_png, save_figure

    def draw():
        fig, ax = headless_pyplot().subplots(figsize=(4, 2))
        x = np.linspace(0, 10, 50)
        for shift in range(3):
            ax.plot(x, np.sin(x + shift), label=f"seed {shift}")
            ax.fill_between(x, np.sin(x + shift) - 0.1, np.sin(x + shift) + 0.1, alpha=0.2)
        ax.legend()
        fig.tight_layout()
        return fig

    plain = io.BytesIO()
    draw().savefig(plain, dpi=80, format="png")
    light = save_figure(draw(), tmp_path / "a.png").read_bytes()
    assert light == light_png(plain.getvalue())  # deterministic: the same drawing gives the same bytes
    assert len(light) < 0.6 * len(plain.getvalue())
    before = np.asarray(Image.open(plain).convert("RGB"), dtype=float)
    after_image = Image.open(io.BytesIO(light))
    after = np.asarray(after_image.convert("RGB"), dtype=float)
    assert after_image.mode == "P" and after.shape == before.shape
    assert np.abs(after - before).mean() < 1.0  # of 255 levels: only anti-aliased edges move


def test_git_keeps_wheels_and_model_files_out_even_the_starts():
    import shutil
    import subprocess

    root = RESULTS_DIR.parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")

    def git(*args: str) -> list[str]:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.split()

    heavy = [p for p in git("ls-files") if p.endswith((".whl", ".safetensors", ".bin", ".pt", ".pth", ".gguf"))]
    assert heavy == []  # the starts' weights live in history (benchmarks.lm_study.starts restores them)
    newcomers = ["pyflakes-4.1.0-py2.py3-none-any.whl", "out/model.safetensors", "benchmarks/results/lm/models/a.bin"]
    newcomers += [f"benchmarks/results/lm_exact/starts/{s}/model.safetensors" for s in ("low", "moderate", "new")]
    newcomers += ["checkpoint.pt"]
    assert git("check-ignore", "--no-index", *newcomers) == newcomers


def test_the_tracked_tree_stays_under_12_mb():
    """The studies' packs take 6.7 MB and the code, tests and docs about 3; a weight file or an uncompacted result
    set (each several MB) passes the bound."""
    import shutil
    import subprocess

    root = RESULTS_DIR.parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    sizes = {name: (root / name).stat().st_size for name in listed.decode().split("\0") if (root / name).is_file()}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total < 12 * 10**6, f"the tracked tree holds {total / 1e6:.2f} MB; the largest files: {largest}"


def test_a_long_start_counts_as_ready_with_its_evaluation_gzipped(tmp_path):
    import gzip

    from benchmarks.lm_study.config import LongProtocol
    from benchmarks.lm_study.long_protocol import start_ready

    start = tmp_path / "low"
    (start / "models" / "sft").mkdir(parents=True)
    (start / "sft_summary.json").write_text("{}")
    (start / "start_eval.json.gz").write_bytes(gzip.compress(b"{}"))  # how the committed evaluations are stored
    assert not start_ready(LongProtocol(), tmp_path, "low")  # no model yet
    (start / "models" / "sft" / "config.json").write_text("{}")
    assert start_ready(LongProtocol(), tmp_path, "low")
