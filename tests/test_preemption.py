"""Interrupted and preempted runs: SIGINT, SIGTERM or SIGUSR1 stops a run at the end of its generation batch with a
checkpoint, one line and exit code 75, no model card; the same command then ends with the weights an uninterrupted
run ends with. Real signals to real processes: one `python -m riskpo_trl.scripts.train`, and two under `accelerate
launch`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainerControl, TrainerState

from riskpo_trl.job.preemption import (
    STOP_FILE_ENV,
    STOPPED_EXIT_CODE,
    StopOnSignal,
    generation_period,
    last_complete_checkpoint,
    remove_card_without_model,
)

ROOT = Path(__file__).resolve().parents[1]
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"
TWO_PROCESSES = ROOT / "recipes/accelerate_configs/cpu_2proc.yaml"
# Four optimizer steps per generation batch, so that a stop has to finish one, and three batches.
PERIOD, MAX_STEPS = 4, 12
STOP_LINE = re.compile(
    rf"Stopped by (SIG\w+) at step (\d+) of {MAX_STEPS}: saved (\S+)\. Run the same command to "
    "resume"
)


def environment(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **extra}


def train_command(model_dir: str, output_dir: Path, processes: int = 1) -> list[str]:
    # No periodic checkpoint: the stop's is the only one.
    script = [
        "-m",
        "riskpo_trl.scripts.train",
        "--config",
        str(TINY_RECIPE),
        "--model_name_or_path",
        model_dir,
        "--output_dir",
        str(output_dir),
        "--dataset_files",
        str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
        "--max_completion_length",
        "8",
        "--steps_per_generation",
        str(PERIOD),
        "--max_steps",
        str(MAX_STEPS),
        "--save_steps",
        "100",
    ]
    if processes == 1:
        return [sys.executable, *script]
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(TWO_PROCESSES),
        "--main_process_port",
        "0",
        *script,
    ]


def run(command: list[str], **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(command, env=environment(**env), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


class Running:
    """A training command in its own session, its merged output collected line by line."""

    def __init__(self, command: list[str], **env: str):
        self.process = subprocess.Popen(
            command,
            env=environment(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self._reader.start()

    def wait_for(self, pattern: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not any(re.search(pattern, line) for line in list(self.lines)):
            assert self.process.poll() is None, "".join(self.lines)[-3000:]
            assert time.monotonic() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.05)

    def finish(self, timeout: float = 600) -> tuple[int, str]:
        code = self.process.wait(timeout)
        self._reader.join(timeout)
        return code, "".join(self.lines)


def same_weights(run_a: Path, run_b: Path) -> None:
    a, b = load_file(run_a / "model.safetensors"), load_file(run_b / "model.safetensors")
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, different


def check_stopped(output: str, output_dir: Path, signal_name: str) -> int:
    """The one line, a checkpoint at a generation-batch boundary before the end, no model and no card."""
    stops = STOP_LINE.findall(output)
    assert len(stops) == 1, output[-3000:]
    name, step, checkpoint = stops[0]
    step = int(step)
    assert name == signal_name
    assert step % PERIOD == 0 and step < MAX_STEPS
    assert Path(checkpoint) == output_dir / f"checkpoint-{step}"
    assert (Path(checkpoint) / "trainer_state.json").is_file() and (Path(checkpoint) / "riskpo_state.json").is_file()
    assert sorted(p.name for p in output_dir.glob("checkpoint-*")) == [f"checkpoint-{step}"]
    assert not (output_dir / "README.md").exists() and not (output_dir / "model.safetensors").exists()
    assert "Traceback" not in output.split("Stopped by")[0]
    return step


# --- one process -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted_one(tiny_model_dir, tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("one") / "run"
    run(train_command(tiny_model_dir, output_dir))
    return output_dir


@pytest.mark.slow
def test_ctrl_c_stops_at_a_checkpoint_and_the_same_command_ends_with_the_uninterrupted_weights(
    tiny_model_dir, uninterrupted_one, tmp_path
):
    output_dir = tmp_path / "run"
    command = train_command(tiny_model_dir, output_dir)
    running = Running(command)
    running.wait_for(rf"\[step 1/{MAX_STEPS}\]")
    running.process.send_signal(signal.SIGINT)
    code, output = running.finish()
    assert code == STOPPED_EXIT_CODE, output[-3000:]
    step = check_stopped(output, output_dir, "SIGINT")

    resumed = run(command)
    assert f"Resuming from {output_dir / f'checkpoint-{step}'}" in resumed.stdout
    assert (output_dir / "README.md").is_file()  # the finished run's card
    same_weights(output_dir, uninterrupted_one)


# --- two processes under accelerate launch ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted_two(tiny_model_dir, tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("two") / "run"
    run(train_command(tiny_model_dir, output_dir, processes=2))
    return output_dir


def rank_process(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.environ().get("RANK") == str(rank):
                    return child
        time.sleep(0.2)
    raise AssertionError(f"no process of rank {rank}")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("delivery", ["SIGUSR1 to rank 1 only", "SIGINT to the launcher", "SIGTERM to every process"])
def test_two_processes_agree_on_the_stop_and_resume_to_the_uninterrupted_weights(
    tiny_model_dir, uninterrupted_two, tmp_path, delivery
):
    output_dir = tmp_path / "run"
    stop_file = tmp_path / "stopped.txt"
    command = train_command(tiny_model_dir, output_dir, processes=2)
    running = Running(command, **{STOP_FILE_ENV: str(stop_file)})
    running.wait_for(rf"\[step 1/{MAX_STEPS}\]")
    signal_name = delivery.split()[0]
    ranks = [rank_process(running.process, rank) for rank in (0, 1)]
    if delivery == "SIGUSR1 to rank 1 only":  # the other process learns of it from the all-reduce
        ranks[1].send_signal(signal.SIGUSR1)
    elif delivery == "SIGINT to the launcher":  # Ctrl-C: torchrun starts its processes in their own sessions, so the
        running.process.send_signal(signal.SIGINT)  # terminal's signal reaches the launcher, which passes it on
    else:  # SLURM signals every process of a step; the launcher passes it on once more
        running.process.send_signal(signal.SIGTERM)
        for process in ranks:
            process.send_signal(signal.SIGTERM)
    code, output = running.finish()
    # The launcher (torchrun) exits 1 either way: it reports the processes' exit code 75 as a failure, or, when it got
    # SIGTERM itself, raises after they exited. The stop file carries the stop past it.
    assert code == 1
    if signal_name == "SIGUSR1":
        reported = re.findall(r"^\s*exitcode\s*: (\d+) \(pid", output, flags=re.MULTILINE)  # its failure table
        # Each process exits 75 once the checkpoint is complete; one that is still exiting when the launcher sees
        # the other's code may be torn down by it (SIGTERM, -15), which the complete checkpoint makes harmless.
        assert str(STOPPED_EXIT_CODE) in reported, output[-3000:]
        assert set(reported) <= {str(STOPPED_EXIT_CODE), "-15"} and len(reported) in (1, 2), output[-3000:]
    step = check_stopped(output, output_dir, signal_name)
    assert STOP_LINE.search(stop_file.read_text()).group(2) == str(step)

    run(command)
    same_weights(output_dir, uninterrupted_two)


# --- the pieces ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps_per_generation", "accumulation", "iterations", "period"),
    [(4, 1, 1, 4), (4, 2, 1, 2), (4, 1, 2, 8), (6, 3, 1, 2), (2, 4, 1, 1)],
)
def test_the_stop_waits_for_the_end_of_the_generation_batch(steps_per_generation, accumulation, iterations, period):
    args = SimpleNamespace(
        steps_per_generation=steps_per_generation,
        gradient_accumulation_steps=accumulation,
        num_iterations=iterations,
        device="cpu",
    )
    assert generation_period(args) == period
    for first_step in (0, 5):  # from scratch, or resumed at step 5: TRL generates anew at the first step
        stop = StopOnSignal(period)
        state = TrainerState(max_steps=100, global_step=first_step)
        stop.on_train_begin(args, state, TrainerControl())
        stop.requested = signal.SIGTERM
        for step in range(first_step + 1, first_step + 3 * period + 1):
            state.global_step = step
            control = TrainerControl()
            stop.on_step_end(args, state, control)
            assert control.should_training_stop == control.should_save == ((step - first_step) % period == 0)
        assert stop.stopped_at == first_step + 3 * period and stop.signal_name == "SIGTERM"


def test_a_signal_during_the_last_step_lets_the_run_finish():
    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1, device="cpu")
    stop = StopOnSignal(1)
    stop.requested = signal.SIGINT
    control = TrainerControl()
    stop.on_step_end(args, TrainerState(max_steps=3, global_step=3), control)
    assert stop.stopped_at is None and not control.should_save


def test_no_signal_no_stop():
    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1, device="cpu")
    stop, control = StopOnSignal(1), TrainerControl()
    stop.on_step_end(args, TrainerState(max_steps=3, global_step=1), control)
    assert stop.stopped_at is None and not control.should_training_stop


def test_resume_skips_a_checkpoint_whose_save_was_cut_short(tmp_path, caplog):
    for step, complete in ((2, True), (4, True), (6, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-4")
    assert "checkpoint-6: no trainer_state.json" in caplog.text
    (tmp_path / "checkpoint-6" / "trainer_state.json").write_text("{}")
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-6")
    assert last_complete_checkpoint(str(tmp_path / "checkpoint-2")) is None


def test_a_card_without_a_model_is_removed_a_card_with_one_is_kept(tmp_path):
    (tmp_path / "README.md").write_text("trained for 3 optimizer steps")
    assert remove_card_without_model(str(tmp_path)) and not (tmp_path / "README.md").exists()
    (tmp_path / "README.md").write_text("card")
    (tmp_path / "config.json").write_text("{}")
    assert not remove_card_without_model(str(tmp_path)) and (tmp_path / "README.md").exists()


HANDLER_PROCESS = """
import sys, time
from riskpo_trl.job.preemption import StopOnSignal
stop = StopOnSignal(4)
stop.checkpoint_saved = sys.argv[2] == "saved"
stop.install()
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    time.sleep(0.02)
print("requested", stop.requested, flush=True)
"""


def handler_process(seconds: float, saved: bool = False) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", HANDLER_PROCESS, str(seconds), "saved" if saved else "running"],
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline() == "ready\n"
    return process


def test_a_second_ctrl_c_aborts_at_once_and_a_quick_repeat_does_not():
    # A repeat within the window (what `accelerate launch` adds to the terminal's Ctrl-C) is the same request.
    process = handler_process(seconds=3)
    process.send_signal(signal.SIGINT)
    time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGTERM)  # ignored: the stop is under way
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip() == f"requested {int(signal.SIGINT)}"
    assert (
        err.count(
            "SIGINT received: stopping at the end of the current generation batch (at most 3 more optimizer steps)"
        )
        == 1
    )

    process = handler_process(seconds=60)
    process.send_signal(signal.SIGINT)
    time.sleep(1.5)
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGINT and time.monotonic() - sent < 10
    assert "Second Ctrl-C: aborting without saving" in err and "Traceback" not in err


class TimingOutTrainer:
    """The parts of a trainer `stopping_on_signals` and `StopOnSignal.finish` use; ``train`` raises a server timeout
    at ``global_step``, and ``_save_checkpoint`` writes what marks a complete checkpoint."""

    def __init__(self, output_dir: Path, global_step: int):
        self.args = SimpleNamespace(
            steps_per_generation=1,
            gradient_accumulation_steps=1,
            num_iterations=1,
            output_dir=str(output_dir),
            should_save=True,
        )
        self.state = TrainerState(max_steps=10, global_step=global_step)
        self.saved, self.printed = [], []
        self.accelerator = SimpleNamespace(
            wait_for_everyone=lambda: None,
            end_training=lambda: None,
            print=self.printed.append,
            is_local_main_process=True,
        )

    def add_callback(self, callback):
        pass

    def remove_callback(self, callback):
        pass

    def train(self):
        from riskpo_trl.weight_sync.bounded import ServerTimeoutError

        raise ServerTimeoutError(f"Generation by http://server:8000 at step {self.state.global_step}: no answer.")

    def _save_checkpoint(self, model, trial):
        folder = Path(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
        self.saved.append(folder.name)

    model = None


@pytest.mark.parametrize(("step", "saved"), [(4, ["checkpoint-4"]), (0, [])])
def test_a_server_timeout_stops_at_a_checkpoint_of_the_last_step_with_exit_75(tmp_path, step, saved):
    """The training script's stop path (the same calls as after a signal): the timeout ends train(), a checkpoint of
    the last completed step is saved (none before the first step), and finish prints the error and the stop line
    and exits 75."""
    from riskpo_trl.job.preemption import RunStopped, stopping_on_signals

    trainer = TimingOutTrainer(tmp_path, step)
    with stopping_on_signals(trainer) as stop:
        trainer.train()
    assert stop.stopped_at == step and trainer.saved == saved
    with pytest.raises(RunStopped) as stopped:
        stop.finish(trainer)
    assert stopped.value.code == STOPPED_EXIT_CODE
    error, line = trainer.printed
    assert error == f"Generation by http://server:8000 at step {step}: no answer."
    assert line.startswith(f"Stopped by a vLLM server timeout at step {step} of 10: ")
    assert (f"saved {tmp_path}/checkpoint-4" if step else "no step to save yet") in line


def test_a_server_timeout_keeps_the_checkpoint_the_step_already_saved(tmp_path):
    trainer = TimingOutTrainer(tmp_path, 3)
    trainer._save_checkpoint(None, None)
    from riskpo_trl.job.preemption import stopping_on_signals

    with stopping_on_signals(trainer) as stop:
        trainer.train()
    assert stop.stopped_at == 3 and trainer.saved == ["checkpoint-3"]  # not saved twice


def test_other_errors_of_training_are_not_turned_into_a_stop(tmp_path):
    from riskpo_trl.job.preemption import stopping_on_signals
    from riskpo_trl.weight_sync.bounded import WeightSyncError

    trainer = TimingOutTrainer(tmp_path, 2)
    with pytest.raises(WeightSyncError), stopping_on_signals(trainer):
        raise WeightSyncError("a checksum differs")


def test_once_the_stop_checkpoint_is_saved_no_signal_changes_the_exit():
    """Three Ctrl-Cs over more than the repeat window, after the stop's checkpoint is written: none aborts."""
    process = handler_process(seconds=3, saved=True)
    for _ in range(3):
        process.send_signal(signal.SIGINT)
        time.sleep(0.6)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip() == "requested None", err
    assert "aborting" not in err


def test_the_checkpoint_counts_as_saved_at_the_stop_step_only():
    args = SimpleNamespace(steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1, device="cpu")
    stop = StopOnSignal(1)
    stop.on_save(args, TrainerState(max_steps=9, global_step=2), TrainerControl())
    assert not stop.checkpoint_saved  # a scheduled checkpoint, no stop asked
    stop.requested = signal.SIGINT
    stop.on_step_end(args, TrainerState(max_steps=9, global_step=3), TrainerControl())
    stop.on_save(args, TrainerState(max_steps=9, global_step=3), TrainerControl())
    assert stop.stopped_at == 3 and stop.checkpoint_saved


def test_a_server_that_stopped_answering_stops_like_a_timeout_and_names_itself(tmp_path):
    """A killed server (its connection refused or dropped) is a stop at a checkpoint with exit 75 too, and the stop
    line says what stopped it."""
    from riskpo_trl.job.preemption import RunStopped, stopping_on_signals
    from riskpo_trl.weight_sync.bounded import ServerUnreachableError

    trainer = TimingOutTrainer(tmp_path, 2)
    with stopping_on_signals(trainer) as stop:
        raise ServerUnreachableError("Generation by http://server:8000 at step 2: the connection was refused.")
    assert trainer.saved == ["checkpoint-2"]
    with pytest.raises(RunStopped):
        stop.finish(trainer)
    assert trainer.printed[1].startswith("Stopped by a vLLM server that stopped answering at step 2 of 10: saved")


def test_a_stop_signal_while_waiting_on_the_server_stops_at_once_at_the_last_step(tmp_path):
    """A signal's handler ends a wait on the server (`interruptible_wait`) with StopRequested: the run stops at once,
    with a checkpoint of its last step and the signal's name in the stop line, not at the end of the batch."""
    from riskpo_trl.job.preemption import RunStopped, stopping_on_signals
    from riskpo_trl.weight_sync.bounded import interruptible_wait

    trainer = TimingOutTrainer(tmp_path, 5)
    started = time.monotonic()
    with stopping_on_signals(trainer) as stop:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with interruptible_wait():
            while time.monotonic() - started < 60:
                time.sleep(0.01)
    assert time.monotonic() - started < 10 and stop.stopped_at == 5 and trainer.saved == ["checkpoint-5"]
    with pytest.raises(RunStopped):
        stop.finish(trainer)
    assert trainer.printed == [
        f"Stopped by SIGTERM at step 5 of 10: saved {tmp_path}/checkpoint-5. Run the same "
        "command to resume (exit code 75)."
    ]


ALARM_PROCESS = """
import signal, time
from riskpo_trl.job.preemption import EXIT_GRACE_S, StopOnSignal
stop = StopOnSignal(4)
stop.checkpoint_saved = True
stop.install()
signal.signal(signal.SIGALRM, lambda *_: None)  # a library's own alarm (math-verify's timeout uses one)
signal.alarm(1)
time.sleep(EXIT_GRACE_S + 2.5)
print("lived", flush=True)
"""


def test_only_a_stop_signal_ends_a_saved_stop():
    """The watchdog reads every handled signal off the wakeup fd: a library's SIGALRM after a saved stop is not a
    stop signal and must not end the process with exit 75."""
    process = subprocess.run(
        [sys.executable, "-c", ALARM_PROCESS], env=environment(), capture_output=True, text=True, timeout=60
    )
    assert process.returncode == 0 and process.stdout.strip() == "lived", process.stderr


def test_a_stop_in_the_callers_process_gives_its_signal_handlers_back(tmp_path):
    """Without exit_after_stop (a notebook, a test) the process goes on after RunStopped: its own handlers return,
    so a later Ctrl-C or a library's signal is the caller's again, never a late exit with 75."""
    from riskpo_trl.job.preemption import RunStopped, stopping_on_signals
    from riskpo_trl.weight_sync.bounded import ServerUnreachableError

    before = {name: signal.getsignal(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGUSR1")}
    trainer = TimingOutTrainer(tmp_path, 2)
    with stopping_on_signals(trainer) as stop:
        raise ServerUnreachableError("Generation by http://server:8000 at step 2: the connection was refused.")
    with pytest.raises(RunStopped):
        stop.finish(trainer)
    assert {name: signal.getsignal(getattr(signal, name)) for name in before} == before


EXIT_PROCESS = """
import ctypes, sys, time
from riskpo_trl.job.preemption import exit_within, start_exit_timer
start_exit_timer()
exit_within(1.0, 75)
print("armed", flush=True)
if sys.argv[1] == "lock":  # a C call that keeps the interpreter lock (PyDLL): no Python thread can run
    ctypes.PyDLL(None).sleep(60)
time.sleep(60)
"""


@pytest.mark.parametrize("main_thread", ["sleep", "lock"])
def test_a_stopped_process_ends_with_75_even_when_no_python_thread_can_run(main_thread):
    """The exit bound after a stop line: the timer thread ends the process with 75; where a C call holds the
    interpreter lock for ever, every thread's stack is printed and the C library's timer ends it with 75 at the
    backstop (Linux; elsewhere faulthandler's thread, with exit code 1)."""
    from riskpo_trl.job.preemption import EXIT_BACKSTOP_S

    process = subprocess.Popen(
        [sys.executable, "-c", EXIT_PROCESS, main_thread],
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline() == "armed\n"  # timed from here: the imports before it are not the bound's
        armed_at = time.monotonic()
        code = process.wait(timeout=60)
    finally:
        process.kill()
    took, stderr = time.monotonic() - armed_at, process.stderr.read()
    assert code == (75 if sys.platform.startswith("linux") or main_thread == "sleep" else 1), stderr[-2000:]
    assert took < 1.0 + EXIT_BACKSTOP_S + 3, took
    assert ("Timeout (0:00:02)!" in stderr) == (main_thread == "lock"), stderr[-2000:]


FINISH_PROCESS = """
import ctypes, os, sys
from types import SimpleNamespace
from riskpo_trl.job.preemption import stopping_on_signals
from riskpo_trl.weight_sync.bounded import ServerTimeoutError

def print_then_hold(text):  # a library that writes the line, then keeps the interpreter lock in a C call
    sys.stdout.write(text + "\\n")
    sys.stdout.flush()
    if text.startswith("Stopped by"):
        ctypes.PyDLL(None).sleep(60)

def save(model, trial):
    os.makedirs(os.path.join(sys.argv[1], "checkpoint-3"))

args = SimpleNamespace(
    steps_per_generation=1, gradient_accumulation_steps=1, num_iterations=1, output_dir=sys.argv[1], should_save=True
)
accelerator = SimpleNamespace(
    wait_for_everyone=lambda: None, end_training=lambda: None, print=print_then_hold, is_local_main_process=True
)
trainer = SimpleNamespace(
    args=args, state=SimpleNamespace(global_step=3, max_steps=10), accelerator=accelerator, model=None,
    add_callback=lambda callback: None, remove_callback=lambda callback: None, _save_checkpoint=save,
)
with stopping_on_signals(trainer, exit_after_stop=True) as stop:
    raise ServerTimeoutError("Generation by http://server:8000 at step 3: no answer.")
stop.finish(trainer)
"""


def test_a_stopped_script_ends_with_75_soon_after_its_stop_line_whatever_holds_it_from_the_line_on(tmp_path):
    """The training script's own process is armed to exit before it prints its stop line: a library that keeps the
    interpreter lock from the line's own write on (as a destructor freed by the garbage collector did, in gloo) still
    sees the process end with 75 within the grace and the backstop, its stacks printed."""
    from riskpo_trl.job.preemption import EXIT_BACKSTOP_S, EXIT_GRACE_S

    process = subprocess.Popen(
        [sys.executable, "-c", FINISH_PROCESS, str(tmp_path)],
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        for line in process.stdout:
            lines.append(line)
            if line.startswith("Stopped by"):
                break
        line_at = time.monotonic()
        code = process.wait(timeout=30)
    finally:
        process.kill()
    after_line = time.monotonic() - line_at
    stderr = process.stderr.read()
    assert lines[-1].startswith("Stopped by a vLLM server timeout at step 3 of 10"), "".join(lines) + stderr[-2000:]
    assert code == (75 if sys.platform.startswith("linux") else 1), stderr[-2000:]
    assert EXIT_GRACE_S < after_line < EXIT_GRACE_S + EXIT_BACKSTOP_S + 3, after_line
    assert "print_then_hold" in stderr  # the stacks say what held the process
