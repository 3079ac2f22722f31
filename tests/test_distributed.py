"""Two processes under `accelerate launch` with DeepSpeed ZeRO-3 on CPU: every rank must bundle alike, and a run
resumed from a ZeRO-3 checkpoint must continue exactly as the uninterrupted one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def launch(output_dir, model_dir, *extra: str) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        os.path.join(ROOT, "recipes", "accelerate_configs", "zero3_cpu.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        "29533",
        os.path.join(HERE, "scripts", "distributed_bundles.py"),
        str(output_dir),
        model_dir,
        *extra,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_ranks_share_bundles_slice_their_own_and_resume_exactly(tiny_model_dir, tmp_path):
    pytest.importorskip("deepspeed")
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate CLI not on PATH")
    launch(tmp_path, tiny_model_dir)
    full = [json.loads((tmp_path / f"full-rank{r}.json").read_text()) for r in (0, 1)]
    assert len(full[0]) == len(full[1]) == 3  # one generation batch per step
    for batch0, batch1 in zip(*full):
        assert batch0["world_size"] == batch1["world_size"] == 2
        assert batch0["bundle_ids"] == batch1["bundle_ids"]
        assert batch0["advantages"] == batch1["advantages"]
        assert batch0["tracker"] == batch1["tracker"]
        total, local = len(batch0["advantages"]), len(batch0["local_advantages"])
        assert total == 2 * local == 100  # 10 prompts x 10 completions gathered from both ranks
        assert batch0["local_advantages"] == pytest.approx(batch0["advantages"][:local])
        assert batch1["local_advantages"] == pytest.approx(batch1["advantages"][local:])
    assert full[0][0]["bundle_ids"] != full[0][1]["bundle_ids"]  # fresh permutations every batch

    # Resume from the ZeRO-3 checkpoint at step 2: step 3 must see the same trackers, bundles and advantages.
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "riskpo_state.json").exists()
    launch(tmp_path, tiny_model_dir, "--resume", str(checkpoint))
    for rank in (0, 1):
        resumed = json.loads((tmp_path / f"resumed-rank{rank}.json").read_text())
        assert [record["step"] for record in resumed] == [3]
        assert resumed[0]["tracker"] == full[rank][2]["tracker"]
        assert resumed[0]["bundle_ids"] == full[rank][2]["bundle_ids"]
        assert resumed[0]["advantages"] == pytest.approx(full[rank][2]["advantages"])


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_ranks_share_leave_one_out_advantages(tiny_model_dir, tmp_path):
    """The baseline is computed on the gathered batch: both ranks hold the same centred advantages, each keeps its
    own slice, and every prompt's advantages sum to 0."""
    pytest.importorskip("deepspeed")
    if shutil.which("accelerate") is None:
        pytest.skip("accelerate CLI not on PATH")
    launch(tmp_path, tiny_model_dir, "--advantage-baseline", "loo")
    full = [json.loads((tmp_path / f"full-rank{r}.json").read_text()) for r in (0, 1)]
    assert len(full[0]) == len(full[1]) == 3
    for batch0, batch1 in zip(*full):
        assert batch0["advantages"] == batch1["advantages"]
        local = len(batch0["local_advantages"])
        assert batch0["local_advantages"] == pytest.approx(batch0["advantages"][:local])
        assert batch1["local_advantages"] == pytest.approx(batch1["advantages"][local:])
        per_prompt = [sum(batch0["advantages"][i : i + 10]) for i in range(0, len(batch0["advantages"]), 10)]
        assert per_prompt == pytest.approx([0.0] * 10, abs=1e-5)
