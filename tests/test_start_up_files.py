"""Every file riskpo-train reads at start-up goes through one reader (no link followed, no blocking, a size cap,
bounded nesting, UTF-8 named by line) and every field is type-checked: each malformed or special file is a short
refusal naming the file and the field, never a traceback, a hang or a read until memory runs out. Bounds on the
restored state come from what the file cannot forge. On a full disk, the lock and the state name their path and
leave nothing behind that delays the next start."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from riskpo_trl.risk.quantile_tracker import QuantileTracker
from riskpo_trl.scripts.early_checks import finished_run
from riskpo_trl.scripts.run_data import recorded_data
from riskpo_trl.trainer import run_lock
from riskpo_trl.trainer.checkpoints import (
    RISK_STATE_FILE,
    check_resume_settings,
    checkpoint_step,
    write_state,
)
from riskpo_trl.trainer.state_files import StateFileError


@pytest.fixture(autouse=True)
def no_hang():
    """A read that blocks (a FIFO) fails the test instead of hanging it."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("a start-up read blocked"))
    signal.alarm(20)
    yield
    signal.alarm(0)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and len(text) < 600, text
    return text


ARGS = argparse.Namespace(max_steps=10, num_train_epochs=1.0)


def make_trainer_state(folder: Path, kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trainer_state.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(
            {
                "list": b"[]",
                "string step": b'{"global_step": "7"}',
                "deep": b"[" * 50_000 + b"]" * 50_000,
                "not utf-8": b'{"global_step": 5,\n "log_history": ["\xff"]}',
                "callbacks a list": b'{"global_step": 5, "stateful_callbacks": []}',
            }[kind]
        )
    return path


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "list", "string step", "deep", "not utf-8"])
def test_a_malformed_trainer_state_is_one_line_naming_the_file(tmp_path, kind):
    """Both pre-torch readers of trainer_state.json (the finished-run check and the data record)."""
    path = make_trainer_state(tmp_path / "checkpoint-5", kind)
    readers = [lambda: finished_run(str(path.parent), ARGS)]
    if kind != "string step":  # the data record does not read the step
        readers.append(lambda: recorded_data(str(path.parent)))
    for read in readers:
        with pytest.raises(ValueError) as refused:
            read()
        message = one_line(refused.value)
        assert str(path) in message, message
    if kind == "string step":
        assert "field 'global_step' must be a whole number, got '7'" in message
    if kind == "not utf-8":
        assert "line 2: not UTF-8" in message


def test_a_wrongly_typed_data_record_names_its_field(tmp_path):
    path = make_trainer_state(tmp_path / "checkpoint-5", "callbacks a list")
    with pytest.raises(
        ValueError, match=r"trainer_state.json: field 'stateful_callbacks' must be an object, got \[\]"
    ):
        recorded_data(str(path.parent))


def risk_state(folder: Path, state) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RISK_STATE_FILE).write_text(json.dumps(state))
    return folder


@pytest.mark.parametrize(
    "state, field",
    [
        ({"quantile_tracker": []}, "quantile_tracker"),
        ({"quantile_tracker": {"levels": 5}}, "levels"),
        ({"quantile_tracker": {"levels": []}}, "levels"),
        ({"settings": "risk"}, "settings"),
    ],
    ids=["tracker a list", "levels 5", "levels []", "settings a string"],
)
def test_a_malformed_risk_state_is_refused_naming_the_field(tmp_path, state, field):
    folder = risk_state(tmp_path / "checkpoint-5", state)
    with pytest.raises(StateFileError) as refused:
        check_resume_settings(str(folder), argparse.Namespace())
    assert f"field '{field}'" in one_line(refused.value) and RISK_STATE_FILE in str(refused.value)


def tracker_state(**overrides) -> dict:
    return {"levels": [0.2, 0.8], "values": [0.1, 0.5], "num_updates": 4, "score_range": [0.0, 1.0], **overrides}


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            {"num_updates": 10**400},
            "field 'num_updates' must be a whole number from 0 to 1e+12, got an integer of 401",
        ),
        ({"score_range": [-1e300, 1e300], "values": [-1e299, 1e299]}, "field 'score_range'"),
    ],
    ids=["num_updates 10**400", "forged score_range"],
)
def test_the_trackers_bounds_are_not_taken_from_the_file_they_bound(overrides, expected):
    """Without a step to bound it (a folder not named checkpoint-N), the count still is; a range of +-1e300 would let
    the file's own estimates pass any check."""
    with pytest.raises(ValueError) as refused:
        QuantileTracker([0.2, 0.8]).load_state_dict(tracker_state(**overrides))
    assert expected in one_line(refused.value)
    QuantileTracker([0.2, 0.8]).load_state_dict(tracker_state())  # the honest state loads


def test_a_checkpoint_folder_and_its_recorded_step_must_agree(tmp_path):
    """checkpoint-900000 whose trainer_state.json says step 5 would allow 900,000 tracker updates."""
    folder = tmp_path / "checkpoint-900000"
    folder.mkdir()
    (folder / "trainer_state.json").write_text('{"global_step": 5}')
    with pytest.raises(StateFileError, match=r"'global_step' is 5, but the folder is named for step 900000"):
        checkpoint_step(str(folder))
    (folder / "trainer_state.json").write_text('{"global_step": 900000}')
    assert checkpoint_step(str(folder)) == 900000


def test_a_lock_of_60000_brackets_is_taken_over_and_a_huge_field_stays_short(tmp_path):
    lock = tmp_path / run_lock.LOCK_FILE
    lock.write_text("[" * 60_000)
    os.utime(lock, (0, 0))  # older than the grace for a lock being written
    run_lock.acquire(str(tmp_path)).release()  # damaged, so stale: taken over, no RecursionError
    lock.write_text(json.dumps({"pid": 1, "host": "h" * 60_000, "boot_id": "b", "pid_namespace": 1}))
    with pytest.raises(run_lock.OutputDirLocked) as refused:
        run_lock.acquire(str(tmp_path))
    assert "another host" in one_line(refused.value)


@pytest.fixture
def full_disk():
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    directory = tempfile.mkdtemp()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", directory], check=True)
    try:
        fill = os.open(os.path.join(directory, "fill"), os.O_WRONLY | os.O_CREAT)
        for size in (4096, 1):
            try:
                while True:
                    os.write(fill, bytes(size))
            except OSError:
                pass
        os.close(fill)
        yield Path(directory)
    finally:
        subprocess.run(["umount", "-l", directory], check=False)
        os.rmdir(directory)


def test_on_a_full_disk_the_lock_and_the_state_name_their_path_and_leave_nothing(full_disk):
    with pytest.raises(OSError, match=r"Could not write the run lock .*_riskpo_run.lock: No space left") as refused:
        run_lock.acquire(str(full_disk))
    one_line(refused.value)
    with pytest.raises(OSError, match=r"Could not write .*riskpo_state.json: No space left"):
        write_state(str(full_disk), {"quantile_tracker": {"levels": [0.2, 0.8]} | {"pad": "x" * 10_000}})
    assert sorted(os.listdir(full_disk)) == ["fill"]  # no empty lock, no .tmp, no probe


def test_a_recipe_that_is_a_fifo_or_not_utf8_is_one_line(tmp_path, capsys):
    from riskpo_trl.scripts import train

    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"learning_rate: 1e-5\n# caf\xe9\n")
    for path, expected in ((fifo, "is a FIFO, not a regular file"), (latin, "latin.yaml, line 2: not UTF-8")):
        with pytest.raises(ValueError, match=expected) as refused:
            train._read_recipe(["--config", str(path)])
        one_line(refused.value)


def test_a_jsonl_row_with_a_byte_that_is_not_utf8_does_not_stop_the_column_check(tmp_path):
    """`datasets` loads such a file (the byte replaced); the pre-torch column check reads the same columns."""
    from riskpo_trl.data.local_files import peek_columns

    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'{"prompt": "caf\xe9", "solution": "1"}\n{"prompt": "b", "solution": "2"}\n')
    assert peek_columns([str(rows)]) == (["prompt", "solution"], 2)
