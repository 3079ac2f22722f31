"""The CPU accelerate configs start the number of processes they promise."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.mark.distributed
def test_cpu_2proc_config_starts_two_gloo_processes(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        os.path.join(ROOT, "recipes", "accelerate_configs", "cpu_2proc.yaml"),
        "--main_process_port",
        "0",  # a free port: other runs may hold the config's
        os.path.join(HERE, "scripts", "report_world.py"),
        str(tmp_path),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    reports = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(report["process_index"] for report in reports) == [0, 1]
    for report in reports:
        assert report["world_size"] == report["process_group_size"] == 2
        assert report["backend"] == "gloo" and report["device"].startswith("cpu")
