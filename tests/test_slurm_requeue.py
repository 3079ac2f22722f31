"""examples/launch/slurm_riskpo.sh under stub `srun`, `scontrol`, `curl`, `trl` and `accelerate` (no SLURM needed):
SLURM's early SIGUSR1 to the batch shell reaches the training processes through a launcher that would die of it, and
the job requeues itself when training stopped at a checkpoint (exit code 75), not when it finished or crashed; and
once with the real training step (torchrun and two processes of the tiny recipe) in place of the stub launcher."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from riskpo_trl.job.preemption import STOPPED_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "examples/launch/slurm_riskpo.sh"
RECIPE = ROOT / "recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_dapo_math.yaml"
TINY_RECIPE = ROOT / "recipes/tiny/riskpo/config_tiny_arithmetic.yaml"

# srun: runs the step here with SLURM_NODEID=0; a signal to srun goes to every process of the step, as slurmstepd
# sends it to the step's whole process-tracking container (torchrun starts each training process in its own session).
SRUN = """#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
export SLURM_NODEID=0
"$@" &
step=$!
descendants() { local child; for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done; }
forward() { kill -"$1" "$step" $(descendants "$step") 2>/dev/null; signalled=1; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM
while :; do signalled=0; wait "$step"; status=$?; (( signalled && status > 128 )) || break; done
exit "$status"
"""
# accelerate: like torchrun's agent, no SIGUSR1 handler of its own, and a failed process makes it exit 1.
LAUNCHER = """#!{python}
import subprocess, sys
worker = subprocess.run([sys.executable, {worker!r}])
print(f"launcher: the training process exited {{worker.returncode}}", flush=True)
sys.exit(0 if worker.returncode == 0 else 1)
"""
# The training process: handles SIGUSR1 like riskpo_trl.job.preemption (stop file, exit 75), or finishes, or
# crashes.
WORKER = """import os, signal, sys, time
stop = []
signal.signal(signal.SIGUSR1, lambda *args: stop.append(1))
open(os.environ["STUB_STARTED"], "w").close()
mode = os.environ["STUB_WORKER"]
end = time.monotonic() + (0 if mode == "finish" else 120)
while not stop and time.monotonic() < end:
    time.sleep(0.05)
if stop and mode == "stop":
    open(os.environ["RISKPO_STOP_FILE"], "w").write("Stopped by SIGUSR1 at step 4 of 8\\n")
    sys.exit(75)
sys.exit(0 if mode == "finish" else 1)
"""


def stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    (tmp_path / "worker.py").write_text(WORKER)
    scripts = {
        "srun": SRUN,
        "scontrol": f'#!/usr/bin/env bash\necho "scontrol $*" >> {log}\n',
        "curl": "#!/usr/bin/env bash\nexit 0\n",
        "trl": "#!/usr/bin/env bash\nexec sleep 300\n",
        "accelerate": LAUNCHER.format(python=sys.executable, worker=str(tmp_path / "worker.py")),
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def start_job(tmp_path: Path, worker: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PATH": f"{stubs(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "STUB_WORKER": worker,
        "STUB_STARTED": str(tmp_path / "started"),
        "TMPDIR": str(tmp_path),
    }
    return subprocess.Popen(
        [
            "bash",
            str(SLURM),
            "--nodelist",
            "n1 n2",
            "--config",
            str(RECIPE),
            "--model",
            "m",
            "--accelerate-config",
            str(ROOT / "recipes/accelerate_configs/zero3.yaml"),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until_training(tmp_path: Path, job: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
        time.sleep(0.05)


def requeues(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_script_asks_for_the_early_signal_to_itself_and_may_be_requeued():
    header = [line for line in SLURM.read_text().splitlines() if line.startswith("#SBATCH")]
    assert any(line.startswith("#SBATCH --signal=B:USR1@") for line in header)
    assert "#SBATCH --requeue" in header and "#SBATCH --open-mode=append" in header
    assert subprocess.run(["bash", "-n", str(SLURM)]).returncode == 0


def test_sigusr1_reaches_the_training_process_and_the_stopped_job_requeues(tmp_path):
    job = start_job(tmp_path, "stop")
    wait_until_training(tmp_path, job)
    job.send_signal(signal.SIGUSR1)
    output, _ = job.communicate(timeout=60)
    assert job.returncode == STOPPED_EXIT_CODE, output
    assert "launcher: the training process exited 75" in output  # the launcher lived through SIGUSR1
    assert requeues(tmp_path) == ["scontrol requeue 4242"]
    assert not list(tmp_path.glob("riskpo-stop-*"))  # the stop file is cleaned up


@pytest.mark.parametrize(("worker", "signal_first", "code"), [("finish", False, 0), ("crash", True, 1)])
def test_a_finished_or_crashed_run_is_not_requeued(tmp_path, worker, signal_first, code):
    job = start_job(tmp_path, worker)
    if signal_first:
        wait_until_training(tmp_path, job)
        job.send_signal(signal.SIGUSR1)
    output, _ = job.communicate(timeout=60)
    assert job.returncode == code, output
    assert requeues(tmp_path) == []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
@pytest.mark.distributed
def test_the_real_training_step_stops_on_the_forwarded_signal_and_the_requeued_job_resumes(tmp_path, tiny_model_dir):
    """The stubs stand in for SLURM only: `accelerate launch` (torchrun) starts two real training processes of the
    tiny recipe, on this machine."""
    (tmp_path / "started").touch()  # the real training process does not write it
    output_dir = tmp_path / "run"
    command = [
        "bash",
        str(SLURM),
        "--nodelist",
        "localhost localhost",
        "--config",
        str(TINY_RECIPE),
        "--model",
        "m",
        "--accelerate-config",
        str(ROOT / "recipes/accelerate_configs/cpu_2proc.yaml"),
        "--gpus-per-node",
        "2",
        "--main-port",
        str(free_port()),
        "--",
        "--model_name_or_path",
        tiny_model_dir,
        "--output_dir",
        str(output_dir),
        "--dataset_files",
        str(ROOT / "examples/data/tiny_arithmetic.jsonl"),
        "--max_completion_length",
        "8",
        "--steps_per_generation",
        "4",
        "--max_steps",
        "12",
        "--save_steps",
        "100",
    ]
    env = {
        **os.environ,
        "PATH": f"{stubs(tmp_path)}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "TMPDIR": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    bin_dir = tmp_path / "bin"
    (bin_dir / "accelerate").unlink()  # the real launcher
    job = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    for line in job.stdout:
        lines.append(line)
        if "[step 1/12]" in line:
            job.send_signal(signal.SIGUSR1)
            break
    lines.extend(job.stdout)
    job.wait(600)
    output = "".join(lines)
    assert job.returncode == STOPPED_EXIT_CODE, output[-4000:]
    assert "Stopped by SIGUSR1 at step 4 of 12" in output or "Stopped by SIGUSR1 at step 8 of 12" in output, output
    assert requeues(tmp_path) == ["scontrol requeue 4242"]

    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    assert "Resuming from" in rerun.stdout and (output_dir / "model.safetensors").is_file()
    assert requeues(tmp_path) == ["scontrol requeue 4242"]
