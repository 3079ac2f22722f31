"""Every process of a multi-process server-mode run ends a failed sync or generation together: two CPU processes
under `accelerate launch` run TRL's own server-mode generate (its gather and broadcast) and a sync, wrapped as the
trainers wrap them, with a main process whose server fails (tests/scripts/agreed_stop.py). No vLLM needed: the
server is a stand-in that never answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run_two_processes(tmp_path: Path, fault: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes/accelerate_configs/cpu_2proc.yaml"),
        "--main_process_port",
        "0",
        str(HERE / "scripts" / "agreed_stop.py"),
        str(tmp_path),
        fault,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("fault", "raised", "said", "within"),
    [
        ("generation-timeout", "ServerTimeoutError", "did not answer /v1/completions (generation) within 2 s", 30),
        ("sync-error", "WeightSyncError", "before the generation at step 3: After the weight update", 30),
        ("signal", "StopRequested", "SIGTERM", 30),
    ],
)
def test_a_failure_of_the_main_process_s_server_ends_every_process_with_its_error(
    tmp_path, fault, raised, said, within
):
    """The other process, waiting in the generation's broadcast or the sync's outcome, raises the main process's
    error (its class and message) instead of waiting for torch's timeout; a SIGTERM cuts the main process's wait on
    a server that never answers (timeout 120 s) short."""
    reports = run_two_processes(tmp_path, fault)
    for rank, report in enumerate(reports):
        assert report["raised"] == raised, (rank, report)
        assert said in report["message"], (rank, report)
        assert report["seconds"] < within, (rank, report)
        assert report["synced"] == [rank]
    assert reports[0]["message"] == reports[1]["message"]
    if fault == "signal":
        assert reports[0]["requested"] == 15 and reports[1]["requested"] is None
