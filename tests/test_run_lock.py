"""One run per output directory: a second run started while one trains there stops with one line naming the first
(PID and host); a run killed without cleaning up leaves a stale lock the next run takes over; a run that ends
releases it, so resuming in the same directory works; under accelerate launch the processes agree."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from riskpo_trl.job.run_lock import LOCK_FILE, OutputDirLocked, acquire
from riskpo_trl.scripts import train

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TINY_DATA = ROOT / "examples/data/tiny_arithmetic.jsonl"


def tiny_run_argv(tmp_path: Path, model_dir: str, max_steps: int) -> list[str]:
    return [
        "--config",
        str(TINY_RECIPE),
        "--model_name_or_path",
        model_dir,
        "--output_dir",
        str(tmp_path / "run"),
        "--dataset_files",
        str(TINY_DATA),
        "--max_completion_length",
        "8",
        "--max_steps",
        str(max_steps),
        "--save_steps",
        "1",
    ]


def wait_for(predicate, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _hold(output_dir: str, taken) -> None:
    acquire(output_dir)
    taken.set()
    time.sleep(600)  # until the test kills it


def test_a_run_is_refused_while_another_holds_the_lock_and_takes_it_over_once_that_one_is_killed(
    tmp_path, tiny_model_dir, capsys
):
    """The other run is a forked process that took the lock (the slow test below runs two real trainings)."""
    context = multiprocessing.get_context("fork")
    taken = context.Event()
    holder = context.Process(target=_hold, args=(str(tmp_path / "run"), taken))
    holder.start()
    try:
        assert taken.wait(timeout=60)
        with pytest.raises(SystemExit) as exit:
            train.cli(tiny_run_argv(tmp_path, tiny_model_dir, 1))
        assert exit.value.code == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert line.startswith(
            f"riskpo-train: error: output_dir {tmp_path / 'run'} is in use by another run: PID "
            f"{holder.pid} on host {socket.gethostname()}, started "
        )
        assert not any((tmp_path / "run").glob("checkpoint-*"))  # it stopped before training
    finally:
        holder.kill()
        holder.join(timeout=60)
    trainer = train.main(*train.parse_args(tiny_run_argv(tmp_path, tiny_model_dir, 1)))
    assert trainer.state.global_step == 1 and not (tmp_path / "run" / LOCK_FILE).exists()


@pytest.mark.slow  # two real training processes; the fast test above holds the lock from a forked process
def test_a_second_run_is_refused_and_a_killed_runs_lock_is_taken_over(tmp_path, tiny_model_dir, capsys):
    output_dir = tmp_path / "run"
    lock = output_dir / LOCK_FILE
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    first = subprocess.Popen(
        [sys.executable, "-m", "riskpo_trl.scripts.train", *tiny_run_argv(tmp_path, tiny_model_dir, 10_000)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Training has begun (a checkpoint exists): the first run holds the lock.
        wait_for(lambda: first.poll() is not None or any(output_dir.glob("checkpoint-*")))
        assert first.poll() is None
        with pytest.raises(SystemExit) as exit:
            train.cli(tiny_run_argv(tmp_path, tiny_model_dir, 2))
        assert exit.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        [line] = [line for line in err.splitlines() if "error:" in line]
        assert line.startswith(
            f"riskpo-train: error: output_dir {output_dir} is in use by another run: PID "
            f"{first.pid} on host {socket.gethostname()}, started "
        )
        first.send_signal(signal.SIGKILL)  # no clean-up: the lock file stays
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    assert json.loads(lock.read_text())["pid"] == first.pid
    # The same host sees that PID is gone: the next run takes the stale lock over, resumes and releases it.
    last = max_checkpoint(output_dir)
    trainer = train.main(*train.parse_args(tiny_run_argv(tmp_path, tiny_model_dir, last + 1)))
    assert trainer.state.global_step == last + 1 == max_checkpoint(output_dir)
    assert not lock.exists()


def max_checkpoint(output_dir: Path) -> int:
    return max(int(path.name.rpartition("-")[2]) for path in output_dir.glob("checkpoint-*"))


def test_a_run_that_ends_releases_the_lock_and_the_same_command_resumes(tmp_path, tiny_model_dir):
    first = train.main(*train.parse_args(tiny_run_argv(tmp_path, tiny_model_dir, 1)))
    assert first.state.global_step == 1 and not (tmp_path / "run" / LOCK_FILE).exists()
    second = train.main(*train.parse_args(tiny_run_argv(tmp_path, tiny_model_dir, 2)))
    assert second.state.global_step == 2 and not (tmp_path / "run" / LOCK_FILE).exists()


def _take(output_dir: str, start, results) -> None:
    start.wait()
    try:
        acquire(output_dir)  # never released: every later taker finds this process alive until the test ends
        results.put("taken")
    except OutputDirLocked:
        results.put("refused")
    time.sleep(2)  # stay alive while the others look


def test_of_runs_starting_together_exactly_one_takes_the_lock(tmp_path):
    context = multiprocessing.get_context("fork")
    start, results = context.Event(), context.Queue()
    takers = [context.Process(target=_take, args=(str(tmp_path), start, results)) for _ in range(6)]
    for taker in takers:
        taker.start()
    start.set()
    outcomes = sorted(results.get(timeout=60) for _ in takers)
    for taker in takers:
        taker.join(timeout=60)
    assert outcomes == ["refused"] * 5 + ["taken"]


def test_a_lock_from_another_host_is_refused_with_the_override(tmp_path):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "other-node", "started": "2026-01-01T00:00:00"}))
    expected = rf"PID 1 on host other-node.*another host.*delete {tmp_path / LOCK_FILE}"
    with pytest.raises(OutputDirLocked, match=expected):
        acquire(str(tmp_path))


def test_a_requeued_slurm_jobs_earlier_lock_is_stale_on_any_node(tmp_path, monkeypatch):
    lock = {
        "pid": 1,
        "host": "other-node",
        "started": "2026-01-01T00:00:00",
        "slurm_job_id": "77",
        "slurm_restart_count": 0,
    }
    (tmp_path / LOCK_FILE).write_text(json.dumps(lock))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the same start of the job: it may still run there
    with pytest.raises(OutputDirLocked, match="PID 1 on host other-node"):
        acquire(str(tmp_path))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # requeued: that start has ended
    taken = acquire(str(tmp_path))
    assert json.loads((tmp_path / LOCK_FILE).read_text())["slurm_restart_count"] == 1
    taken.release()


def this_machine() -> dict:
    """The boot id and PID namespace of this process, as a lock file records them."""
    return {
        "host": socket.gethostname(),
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_namespace": os.readlink("/proc/self/ns/pid"),
    }


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_reused_pid_does_not_hold_the_lock(tmp_path):
    """The recorded PID runs again, but as another process (its start time differs): the lock is stale."""
    (tmp_path / LOCK_FILE).write_text(
        json.dumps({"pid": os.getpid(), **this_machine(), "started": "2026-01-01T00:00:00", "process_start": -1})
    )
    acquire(str(tmp_path)).release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_records_the_boot_id_and_pid_namespace(tmp_path):
    lock = acquire(str(tmp_path))
    recorded = json.loads((tmp_path / LOCK_FILE).read_text())
    lock.release()
    assert {key: recorded[key] for key in this_machine()} == this_machine() and recorded["pid"] == os.getpid()


@pytest.mark.parametrize(
    "field, value, where",
    [
        ("pid_namespace", "pid:[1]", "another PID namespace"),
        ("boot_id", "00000000-0000-0000-0000-000000000000", "another boot id"),
    ],
)
def test_a_lock_from_another_pid_namespace_or_boot_is_refused_with_the_override(tmp_path, field, value, where):
    """The same hostname, but the PID means another process there (a container with host networking): its PID not
    running here says nothing, so the lock is not taken over."""
    lock = {"pid": dead_pid(), **this_machine(), field: value, "started": "2026-01-01T00:00:00"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(lock))
    with pytest.raises(OutputDirLocked, match=rf"{where}.*delete {tmp_path / LOCK_FILE}"):
        acquire(str(tmp_path))
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == lock


def test_a_lock_of_an_earlier_version_is_taken_over_only_by_hand(tmp_path):
    """Without a boot id and PID namespace, a PID that runs here holds the lock, and one that does not is not proof
    that its run ended: refused, with the override."""
    old = {"pid": os.getpid(), "host": socket.gethostname(), "started": "2026-01-01T00:00:00"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(old))
    with pytest.raises(OutputDirLocked, match="Wait for it to finish"):
        acquire(str(tmp_path))
    (tmp_path / LOCK_FILE).write_text(json.dumps({**old, "pid": dead_pid()}))
    with pytest.raises(OutputDirLocked, match=rf"earlier version.*delete {tmp_path / LOCK_FILE}"):
        acquire(str(tmp_path))


@pytest.mark.parametrize("pid", [-1, 0, 10**30, "1234", None, True])
def test_a_lock_naming_an_impossible_pid_is_refused_clearly(tmp_path, pid):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, **this_machine(), "started": "2026-01-01T00:00:00"}))
    with pytest.raises(OutputDirLocked, match=rf"which no process can have.*delete {tmp_path / LOCK_FILE}"):
        acquire(str(tmp_path))


def test_a_pid_above_pid_max_is_refused(tmp_path):
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid_max + 1, **this_machine(), "started": "2026-01-01"}))
    with pytest.raises(OutputDirLocked, match=f"from 1 to {pid_max}"):
        acquire(str(tmp_path))


@pytest.mark.parametrize("kind", ["dangling symlink", "symlink to a lock", "directory", "fifo"])
def test_anything_but_a_regular_file_at_the_lock_path_is_refused_by_name(tmp_path, kind):
    path = tmp_path / LOCK_FILE
    if kind == "dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    elif kind == "symlink to a lock":
        (tmp_path / "elsewhere").write_text(json.dumps({"pid": dead_pid(), **this_machine(), "started": "x"}))
        path.symlink_to(tmp_path / "elsewhere")
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)
    with pytest.raises(OutputDirLocked, match=rf"{path} is a .*not a run's lock file.*Remove it"):
        acquire(str(tmp_path))
    assert os.path.lexists(path)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare for a real PID namespace"
)
def test_a_run_in_another_pid_namespace_keeps_its_lock(tmp_path):
    """A real holder in a new PID namespace (where it is PID 1, and this namespace's PID 1 is another process)."""
    holder = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom riskpo_trl.job.run_lock import acquire\nacquire(sys.argv[1])\n"
                "print('held', flush=True)\ntime.sleep(120)"
            ),
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        recorded = json.loads((tmp_path / LOCK_FILE).read_text())
        assert recorded["pid_namespace"] != this_machine()["pid_namespace"]
        with pytest.raises(OutputDirLocked, match="another PID namespace"):
            acquire(str(tmp_path))
        assert json.loads((tmp_path / LOCK_FILE).read_text()) == recorded
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.distributed
def test_under_accelerate_launch_the_main_process_holds_it_for_all(tmp_path):
    held, free = tmp_path / "held", tmp_path / "free"
    holder = acquire(str(held))  # this test's process: alive, on this host
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes/accelerate_configs/cpu_2proc.yaml"),
        "--main_process_port",
        "0",
        str(HERE / "scripts/lock_under_launch.py"),
        str(held),
        str(free),
        str(tmp_path),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    holder.release()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    # Both processes refuse the held directory with the main process's message, naming this test's process.
    assert rank0["held"] == rank1["held"] and f"PID {os.getpid()} on host" in rank0["held"]
    # The free one: one lock, taken by the main process, seen by both, gone at the end.
    assert rank0["free_lock"] == rank1["free_lock"] and rank0["free_lock"]["pid"] == rank0["pid"]
    assert not (free / LOCK_FILE).exists()


def test_the_lock_does_not_make_a_hub_like_model_path_read_as_local(tmp_path, monkeypatch, capsys):
    """Taking the lock creates output_dir (outputs/run here); `outputs/tiny-qwen2` must still be refused as a
    possible Hub id for build_tiny_model, as it is where no outputs/ exists."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        train.cli(
            [
                "--config",
                str(TINY_RECIPE),
                "--model_name_or_path",
                "outputs/tiny-qwen2",
                "--output_dir",
                "outputs/run",
                "--dataset_files",
                str(TINY_DATA),
            ]
        )
    assert "'outputs/tiny-qwen2' could be a Hub id" in capsys.readouterr().err
    assert not (tmp_path / "outputs").exists()


def test_a_huge_lock_file_is_refused_by_name_not_read(tmp_path):
    path = tmp_path / LOCK_FILE
    with open(path, "wb") as file:
        file.truncate(3 * 10**9)  # sparse: 3 GB that take no disk
    with pytest.raises(OutputDirLocked, match=rf"{path} holds 3000000000 bytes.*not a run's lock file.*Remove it"):
        acquire(str(tmp_path))
    assert path.stat().st_size == 3 * 10**9


def test_a_skewed_clock_does_not_make_a_lock_being_written_look_stale(tmp_path, monkeypatch):
    """This host's clock 10 s ahead of the filesystem's (an NFS server's): a lock created empty a moment ago is still
    being written by its run, which then holds it; judged by ``time.time() - st_mtime`` it looked 10 s old."""
    from riskpo_trl.job import run_lock

    skewed = types.SimpleNamespace(time=lambda: time.time() + 10, monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(run_lock, "time", skewed)
    path = tmp_path / LOCK_FILE
    path.touch()  # the first run's exclusive create; it writes its content a moment later

    def first_run_writes():
        time.sleep(1.0)
        path.write_text(json.dumps({"pid": os.getpid(), **this_machine(), "started": "now"}))

    writer = threading.Thread(target=first_run_writes)
    writer.start()
    try:
        with pytest.raises(OutputDirLocked, match="is in use by another run"):
            acquire(str(tmp_path))
    finally:
        writer.join()
    assert json.loads(path.read_text())["pid"] == os.getpid()


def _hold_and_report(output_dir: str, contents) -> None:
    contents.put(acquire(output_dir).content)
    time.sleep(600)  # until the test kills it


def lock_after_the_first_holder_releases(output_dir: Path) -> tuple[str | None, str]:
    """A first run's lock taken over by a second run, in another process (the first judged gone: a requeued job's
    earlier start), then released by the first run as it exits: the lock file's text, and the second run's. The
    second run still holds the lock when the test reads it, and is killed after."""
    first = acquire(str(output_dir))
    os.unlink(first.path)  # the takeover removes the stale lock
    context = multiprocessing.get_context("fork")
    contents = context.Queue()
    second = context.Process(target=_hold_and_report, args=(str(output_dir), contents), daemon=True)
    second.start()
    try:
        second_content = contents.get(timeout=60)
        first.release()
        path = output_dir / LOCK_FILE
        text = path.read_text() if path.exists() else None
        if text == second_content:
            with pytest.raises(OutputDirLocked, match="is in use by another run"):
                acquire(str(output_dir))  # the second run still holds output_dir
        return text, second_content
    finally:
        second.kill()
        second.join(timeout=60)


def test_a_second_holders_lock_survives_the_first_holders_release(tmp_path):
    text, second = lock_after_the_first_holder_releases(tmp_path)
    assert text == second


def test_a_release_that_ignores_ownership_fails_the_survival_test(tmp_path, monkeypatch):
    """Mutation: release without "only if it is still ours" removes the second run's lock."""
    from riskpo_trl.job.run_lock import RunLock

    def release_whatever_holds_it(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    monkeypatch.setattr(RunLock, "release", release_whatever_holds_it)
    text, second = lock_after_the_first_holder_releases(tmp_path)
    assert text is None  # the survival test above fails on this release
