"""Local data files are checked before `datasets` reads them (a row nested too deeply is one line naming the file and
line, where pyarrow's reader would crash), and folders of data files are read by split for dataset_name and
dataset_files."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
import lzma
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from datasets import Dataset
from test_start_up_errors import run_cli  # the single 'error:' line, exit code 2, no traceback
from test_user_datasets import ROWS, TEXT_ROWS, recipe_without_data, run_cli_error, write_jsonl

from riskpo_trl.data import json_nesting
from riskpo_trl.data.json_nesting import MAX_JSON_NESTING, JsonNestingError, check_json_nesting
from riskpo_trl.scripts import eval as eval_script
from riskpo_trl.scripts import train
from riskpo_trl.tracks import load_train_dataset

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
GSM8K_ROWS = [
    {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}"}
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]
]


def nested(depth: int) -> str:
    """A JSON value of ``depth`` lists inside one another."""
    return "[" * depth + "]" * depth


def file_with_deep_row(path: Path, depth: int, honest_rows: int = 2) -> Path:
    """``honest_rows`` rows of the training schema, then one whose ``solution`` nests ``depth`` lists (with the row's
    own object: ``depth + 1`` levels)."""
    lines = [json.dumps(row) for row in ROWS[:honest_rows]]
    lines.append('{"prompt": "What is 1 + 1?", "solution": ' + nested(depth) + "}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_row_nested_200000_deep_is_one_error_line_naming_file_and_line(tmp_path):
    """pyarrow's JSON reader overflows the C stack on this row (exit code 139, no message); the CLI refuses the file
    first, before any model is built."""
    deep = file_with_deep_row(tmp_path / "deep.jsonl", 200_000)
    model_dir = tmp_path / "never-built"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "riskpo_trl.scripts.train",
            "--config",
            str(TINY_RECIPE),
            "--dataset_name",
            "json",
            "--dataset_files",
            str(deep),
            "--model_name_or_path",
            str(model_dir),
            "--output_dir",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if "error:" in line]
    assert f"Dataset file {deep}, line 3: JSON nested more than {MAX_JSON_NESTING} levels deep" in line
    assert "Traceback" not in result.stderr
    assert not model_dir.exists()


def test_riskpo_eval_refuses_a_deep_rows_file_in_one_line(tmp_path, capsys, tiny_model_dir):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"problem": "1 + 1?", "answer": "2"}\n{"problem": ' + nested(200_000) + ', "answer": "2"}\n')
    line = run_cli(
        eval_script.cli,
        ["--model", tiny_model_dir, "--dataset_files", str(deep), "--output_dir", str(tmp_path / "eval")],
        capsys,
    )
    assert f"{deep}, line 2: JSON nested more than" in line


def test_the_deepest_row_arrow_holds_loads_and_one_level_more_is_refused(tmp_path):
    """The limit refuses nothing `datasets` could load: a row as deep as Arrow holds loads; past the limit, refused."""
    honest = file_with_deep_row(tmp_path / "deepest.jsonl", 62)  # 63 levels with the row's own object
    loaded = load_train_dataset("json", data_files=[str(honest)])
    assert len(loaded) == 3
    too_deep = file_with_deep_row(tmp_path / "too_deep.jsonl", MAX_JSON_NESTING)
    with pytest.raises(JsonNestingError, match=r"too_deep.jsonl, line 3: JSON nested more than 64 levels deep"):
        load_train_dataset("json", data_files=[str(too_deep)])


def test_brackets_inside_strings_do_not_count(tmp_path):
    """Brackets and escaped quotes inside strings are text: a row with 200,000 of them trains like any other."""
    rows = [*TEXT_ROWS, {"prompt": 'Is this "' + nested(100_000) + '\\" balanced?', "solution": '\\"[[[{'}]
    path = write_jsonl(tmp_path / "text.jsonl", rows)
    loaded = load_train_dataset("json", data_files=[str(path)], prompt_template="raw")  # the text as it is
    assert loaded[len(TEXT_ROWS)]["prompt"] == rows[-1]["prompt"]


def test_a_pretty_printed_json_file_is_refused_at_the_line_that_goes_too_deep(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text("[\n" + "".join("  " * i + "[\n" for i in range(MAX_JSON_NESTING + 5)))
    with pytest.raises(JsonNestingError, match=rf"rows.json, line {MAX_JSON_NESTING + 1}:"):
        check_json_nesting(path)


def random_value(rng: random.Random, depth: int):
    choice = rng.random()
    if depth < 7 and choice < 0.3:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 7 and choice < 0.6:
        return {rng.choice(["a", "[", '"{', "\\"]): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return rng.choice(["x", "[[[", '\\"[', "\\", '"', 1, None, '}}\\\\"{{', "é[ü"])


def depth_of(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


def test_the_scan_finds_the_first_row_too_deep_whatever_the_chunk_boundaries(tmp_path, monkeypatch):
    """Against each row's depth as Python sees it, on rows whose strings hold brackets, quotes and backslashes, read
    in chunks of a few bytes so that strings and escapes straddle them."""
    rng = random.Random(0)
    for trial in range(300):
        rows = [random_value(rng, 0) for _ in range(rng.randint(1, 4))]
        limit = rng.randint(0, 7)
        path = tmp_path / f"rows{trial}.jsonl"
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
        monkeypatch.setattr(json_nesting, "CHUNK_BYTES", rng.randint(1, 40))
        first_too_deep = next((i + 1 for i, row in enumerate(rows) if depth_of(row) > limit), None)
        if first_too_deep is None:
            check_json_nesting(path, limit)
        else:
            with pytest.raises(JsonNestingError, match=rf", line {first_too_deep}:"):
                check_json_nesting(path, limit)


@pytest.mark.parametrize("name", ["archer_code", "geometry3k"])
def test_the_code_and_geometry_loaders_check_their_local_files(tmp_path, name):
    deep = file_with_deep_row(tmp_path / "deep.jsonl", 200_000, honest_rows=0)
    with pytest.raises(JsonNestingError, match=r"deep.jsonl, line 1:"):
        load_train_dataset(name, data_files=[str(deep)])


# --- folders of data files


def test_a_folder_as_dataset_name_is_read_by_split(tmp_path):
    folder = tmp_path / "mydata"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS[:3])
    write_jsonl(folder / "test.jsonl", ROWS[3:])
    assert load_train_dataset(f"{folder}/")["solution"] == [row["solution"] for row in ROWS[:3]]
    assert load_train_dataset(str(folder), split="test")["solution"] == [ROWS[3]["solution"]]
    with pytest.raises(
        ValueError,
        match=r"no data files of split 'rl': by their names its files are split into "
        r"train, test",
    ):
        load_train_dataset(str(folder), split="rl")


def test_a_folder_as_dataset_files_reads_the_files_in_it(tmp_path):
    folder = tmp_path / "rows"
    (folder / "more").mkdir(parents=True)
    write_jsonl(folder / "a.jsonl", ROWS[:2])
    write_jsonl(folder / "more" / "b.jsonl", ROWS[2:])
    loaded = load_train_dataset("json", data_files=[str(folder)])
    assert sorted(loaded["solution"]) == sorted(row["solution"] for row in ROWS)
    gsm8k_folder = tmp_path / "gsm8k"
    gsm8k_folder.mkdir()
    write_jsonl(gsm8k_folder / "part.jsonl", GSM8K_ROWS)
    assert load_train_dataset("gsm8k", data_files=[str(gsm8k_folder)])["solution"] == ["3", "7", "11", "15"]


def make_empty(folder: Path) -> None:
    pass


def make_notes_only(folder: Path) -> None:
    (folder / "notes.txt").write_text("not data\n")


@pytest.mark.parametrize("make", [make_empty, make_notes_only], ids=["empty", "no data files"])
@pytest.mark.parametrize("option", ["--dataset_name", "--dataset_files"])
def test_a_folder_without_data_files_is_one_short_line(tmp_path, capsys, make, option):
    folder = tmp_path / "mydata"
    folder.mkdir()
    make(folder)
    options = [option, str(folder)] if option == "--dataset_name" else ["--dataset_name", "json", option, str(folder)]
    line = run_cli_error(options, tmp_path, capsys, str(tmp_path / "never-built"))
    assert line == f"riskpo-train: error: no data files in {folder} (looked for .jsonl, .json, .csv, .parquet)."


@pytest.mark.parametrize(
    ("files", "options", "expected"),
    [
        (
            {"a.jsonl": ROWS, "b.csv": ROWS},
            ["--dataset_name", "{folder}"],
            "holds data files of several formats (.csv",
        ),
        (
            {"train.jsonl": ROWS, "test.jsonl": ROWS},
            ["--dataset_name", "json", "--dataset_files", "{folder}"],
            "its file names split it into train, test",
        ),
        (
            {"rows.jsonl": ROWS},
            ["--dataset_name", "{folder}", "--dataset_files", "other.jsonl"],
            "is a folder, read for the data files in it, and dataset_files (other.jsonl) is set too",
        ),
        (
            {"rows.csv": ROWS},
            ["--dataset_name", "json", "--dataset_files", "{folder}"],
            "rows.csv is csv by its extension, but dataset_name 'json' reads it as json. Set dataset_name csv.",
        ),
    ],
    ids=["two formats", "two splits as dataset_files", "folder and files", "format mismatch"],
)
def test_folder_mistakes_are_one_line(tmp_path, capsys, monkeypatch, files, options, expected):
    folder = tmp_path / "mydata"
    folder.mkdir()
    for name, rows in files.items():
        if name.endswith(".csv"):
            Dataset.from_list([{"prompt": r["prompt"][0]["content"], "solution": r["solution"]} for r in rows]).to_csv(
                folder / name
            )
        else:
            write_jsonl(folder / name, rows)
    write_jsonl(tmp_path / "other.jsonl", ROWS)
    monkeypatch.chdir(tmp_path)
    line = run_cli_error(
        [option.format(folder=folder) for option in options], tmp_path, capsys, str(tmp_path / "never-built")
    )
    assert expected in line and len(line) < 400


def test_a_folder_of_rows_trains_from_the_command_line(tmp_path, tiny_model_dir):
    """The own-data path: a folder of the user's rows named on the command line trains, and the card names it."""
    folder = tmp_path / "mydata"
    folder.mkdir()
    write_jsonl(folder / "rows.jsonl", ROWS)
    output_dir = tmp_path / "run"
    train.cli(
        [
            "--config",
            str(recipe_without_data(tmp_path)),
            "--model_name_or_path",
            tiny_model_dir,
            "--output_dir",
            str(output_dir),
            "--max_steps",
            "1",
            "--save_strategy",
            "no",
            "--max_completion_length",
            "8",
            "--dataset_name",
            "json",
            "--dataset_files",
            f"{folder}/",
        ]
    )
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 1
    assert "`mydata`" in (output_dir / "README.md").read_text()


def test_the_tiny_recipe_trains_on_a_folder_named_as_dataset_name(tmp_path, tiny_model_dir):
    """The README's recipe with ``--dataset_name DIR/``: the folder's rows replace the recipe's dataset and files
    (resolved inside the folder they would not exist), and the run's card names the folder."""
    folder = tmp_path / "mydata"
    folder.mkdir()
    write_jsonl(folder / "rows.jsonl", ROWS)
    output_dir = tmp_path / "run"
    train.cli(
        [
            "--config",
            str(ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"),
            "--model_name_or_path",
            tiny_model_dir,
            "--build_tiny_model",
            "false",
            "--output_dir",
            str(output_dir),
            "--max_steps",
            "1",
            "--save_strategy",
            "no",
            "--dataset_name",
            f"{folder}/",
        ]
    )
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 1
    assert "mydata" in (output_dir / "README.md").read_text()


# --- compressed files: scanned by their first bytes, as `datasets` reads them


def compressed(path: Path, opener) -> Path:
    """``path`` compressed with ``opener`` in place, under the same name."""
    data = path.read_bytes()
    with opener(path, "wb") as file:
        file.write(data)
    return path


@pytest.mark.parametrize("opener", [gzip.open, bz2.open, lzma.open], ids=["gzip", "bz2", "xz"])
def test_a_compressed_file_under_a_plain_name_is_scanned_as_datasets_reads_it(tmp_path, opener):
    """A deep row in ``train.jsonl`` that is really compressed: the crash the scan exists to prevent, refused."""
    deep = compressed(file_with_deep_row(tmp_path / "train.jsonl", 200_000), opener)
    with pytest.raises(JsonNestingError, match=r"train.jsonl, line 3: JSON nested more than 64 levels deep"):
        load_train_dataset("json", data_files=[str(deep)])


def test_a_compressed_file_of_honest_rows_still_loads(tmp_path):
    path = compressed(write_jsonl(tmp_path / "train.jsonl", TEXT_ROWS), gzip.open)
    assert len(load_train_dataset("json", data_files=[str(path)])) == len(TEXT_ROWS)


def test_each_member_of_a_zip_archive_is_scanned(tmp_path):
    honest = write_jsonl(tmp_path / "honest.jsonl", TEXT_ROWS)
    deep = file_with_deep_row(tmp_path / "deep.jsonl", 200_000)
    archive = tmp_path / "train.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        zipped.write(honest, "a/honest.jsonl")
        zipped.write(deep, "b/deep.jsonl")
    with pytest.raises(JsonNestingError, match=r"train.zip \(archive member b/deep.jsonl\), line 3: JSON nested"):
        load_train_dataset("json", data_files=[str(archive)])


def test_a_compressed_file_the_scan_cannot_read_is_refused_by_name(tmp_path):
    """zstd without the zstandard package, and a gzip file cut short: one error naming the file, nothing loaded."""
    truncated = tmp_path / "cut.jsonl"
    truncated.write_bytes(compressed(write_jsonl(tmp_path / "whole.jsonl", TEXT_ROWS), gzip.open).read_bytes()[:30])
    with pytest.raises(JsonNestingError, match=r"cut.jsonl: it cannot be decompressed"):
        check_json_nesting(truncated)
    if importlib.util.find_spec("zstandard") is None:
        zstd = tmp_path / "rows.jsonl"
        zstd.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64))
        with pytest.raises(JsonNestingError, match=r"rows.jsonl: .*zstd-compressed.*pip install zstandard"):
            check_json_nesting(zstd)


def test_a_file_that_decompresses_past_the_cap_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(json_nesting, "MAX_DECOMPRESSED_BYTES", 1000)
    path = compressed(write_jsonl(tmp_path / "big.jsonl", TEXT_ROWS * 50), gzip.open)
    with pytest.raises(JsonNestingError, match=r"big.jsonl: it expands to more than"):
        check_json_nesting(path)


def test_a_bz2_bomb_is_refused_by_its_expansion_ratio(tmp_path):
    """1 GiB of spaces in a few kB (concatenated bz2 streams, which `datasets` reads whole) is refused once the scan
    has decompressed the file's ratio bound (200 x its size plus 64 MiB), not after the whole GiB."""
    stream = bz2.compress(b" " * (4 << 20))
    bomb = tmp_path / "rows.jsonl"
    bomb.write_bytes(stream * 256)
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(JsonNestingError, match=r"rows.jsonl: it expands to more than 200 times its"):
        check_json_nesting(bomb)


def test_a_jsonl_file_with_a_zip_appended_is_scanned_as_the_zip_datasets_reads(tmp_path):
    """`datasets` takes a file whose end is a zip's central directory for a zip, whatever its first bytes, and loads
    the archive's members: the deep row inside is found, where pyarrow would crash on it."""
    member = file_with_deep_row(tmp_path / "deep.jsonl", 200_000)
    polyglot = tmp_path / "t.jsonl"
    polyglot.write_bytes(b'{"a":1}\n')
    with zipfile.ZipFile(polyglot, "a", zipfile.ZIP_DEFLATED) as zipped:  # a zip appended to the JSON lines
        zipped.write(member, "deep.jsonl")
    from datasets.utils.extract import Extractor

    assert json_nesting.archive_format(str(polyglot)) == Extractor.infer_extractor_format(str(polyglot)) == "zip"
    with pytest.raises(JsonNestingError, match=r"t.jsonl \(archive member deep.jsonl\), line 3: JSON nested"):
        check_json_nesting(polyglot)


def test_the_scan_picks_the_format_datasets_extracts_for_every_kind_of_file(tmp_path):
    """`archive_format` against `datasets`' own Extractor on files made to confuse it: a zip by each of its magic
    numbers and by its end record only, tars plain and compressed, each stream format, and magic numbers the scan
    cannot follow (refused by name)."""
    import io
    import tarfile

    from datasets.utils.extract import Extractor

    rows = write_jsonl(tmp_path / "rows.jsonl", TEXT_ROWS)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.write(rows, "rows.jsonl")
    files = {
        "plain.jsonl": rows.read_bytes(),
        "appended.jsonl": rows.read_bytes() + zipped.getvalue(),
        "spanned.jsonl": b"PK\x07\x08" + zipped.getvalue(),
        "empty.zip": b"PK\x05\x06" + bytes(18),
        "rows.gz": gzip.compress(rows.read_bytes()),
        "rows.bz2": bz2.compress(rows.read_bytes()),
        "rows.xz": lzma.compress(rows.read_bytes()),
        "rows.lz4": b"\x04\x22\x4d\x18" + bytes(16),
        "rows.7z": b"7z\xbc\xaf\x27\x1c" + bytes(16),
        "rows.rar": b"Rar!\x1a\x07\x00" + bytes(16),
    }
    for mode in ("w", "w:gz", "w:bz2"):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode=mode) as archive:
            archive.add(rows, "rows.jsonl")
        files[f"rows.{mode}.tar"] = buffer.getvalue()
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert json_nesting.archive_format(str(path)) == Extractor.infer_extractor_format(str(path)), name
    for name in ("rows.lz4", "rows.7z", "rows.rar"):
        with pytest.raises(JsonNestingError, match=name + r": it is a (lz4|7z|rar) archive; the nesting check cannot"):
            check_json_nesting(tmp_path / name)
    for name in ("appended.jsonl", "spanned.jsonl", "rows.w:gz.tar", "rows.w:bz2.tar"):
        check_json_nesting(tmp_path / name)  # honest rows inside: scanned, not refused


ZIP_SCAN = """
import resource, sys
from riskpo_trl.data.json_nesting import check_json_nesting
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
check_json_nesting(sys.argv[1])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.slow  # 3.4 s at load 7 (building the archive is most of it)
def test_a_zip_of_many_bz2_members_is_scanned_with_one_member_open_at_a_time(tmp_path):
    """10,000 bzip2 members (each one's decompressor holds some 40 kB while open): the scan's peak memory stays
    that of one member, where keeping every member open until the last took about 400 MB (3.8 GB for 100,000)."""
    archive = tmp_path / "rows.zip"
    row = json.dumps(TEXT_ROWS[0]) + "\n"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_BZIP2) as zipped:
        for index in range(10_000):
            zipped.writestr(f"{index}.jsonl", row)
    scan = subprocess.run(
        [sys.executable, "-c", ZIP_SCAN, str(archive)], capture_output=True, text=True, timeout=120, check=True
    )
    assert int(scan.stdout) < 150_000, scan.stdout  # kB of peak RSS growth


def test_a_registered_dataset_reads_a_csv_file_as_csv(tmp_path):
    """One reader decided by extension for every path: a CSV in the registered dataset's schema is not read as JSON."""
    from riskpo_trl.data.local_files import load_local_files, reader_of

    path = tmp_path / "gsm8k_rows.csv"
    Dataset.from_list(GSM8K_ROWS).to_csv(path, index=False)
    assert [reader_of(p) for p in ("a.csv", "a.parquet", "a.jsonl", "a.json", "a.jsonl.gz")] == [
        "csv",
        "parquet",
        "json",
        "json",
        "json",
    ]
    assert load_local_files(str(path)).to_list() == GSM8K_ROWS
    dataset = load_train_dataset("gsm8k", data_files=str(path))
    assert dataset[0]["solution"] == "3" and len(dataset) == len(GSM8K_ROWS)
