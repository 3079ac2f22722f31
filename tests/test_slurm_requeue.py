"""examples/launch/slurm_riskpo.sh under stub `srun`, `scontrol`, `curl`, `trl` and `accelerate` (no SLURM needed):
SLURM's early SIGUSR1 to the batch shell reaches the training processes through a launcher that would die of it, and
the job requeues itself when training stopped at a checkpoint (exit code 75), not when it finished or crashed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from riskpo_trl.preemption import STOPPED_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "examples/launch/slurm_riskpo.sh"
RECIPE = ROOT / "recipes/DeepSeek-R1-Distill-Qwen-1.5B/riskpo/config_dapo_math.yaml"

# srun: runs the step here with SLURM_NODEID=0; a signal to srun goes to every process of the step, as slurmstepd does.
SRUN = """#!/usr/bin/env bash
while [[ "$1" == --* ]]; do shift; done
export SLURM_NODEID=0
setsid "$@" &
step=$!
trap 'kill -USR1 -- -$step 2>/dev/null; signalled=1' USR1
trap 'kill -TERM -- -$step 2>/dev/null; signalled=1' TERM
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
# The training process: handles SIGUSR1 like riskpo_trl.preemption (stop file, exit 75), or finishes, or crashes.
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
    env = {**os.environ, "PATH": f"{stubs(tmp_path)}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "STUB_WORKER": worker, "STUB_STARTED": str(tmp_path / "started"), "TMPDIR": str(tmp_path)}
    return subprocess.Popen(
        ["bash", str(SLURM), "--nodelist", "n1 n2", "--config", str(RECIPE), "--model", "m",
         "--accelerate-config", str(ROOT / "recipes/accelerate_configs/zero3.yaml")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


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
