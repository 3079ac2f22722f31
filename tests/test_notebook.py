"""The quickstart notebook runs top to bottom, so it cannot rot."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_notebook_executes(monkeypatch):
    notebook = nbformat.read(ROOT / "examples/notebooks/quickstart.ipynb", as_version=4)
    # The kernel must import this checkout's riskpo_trl.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    client = NotebookClient(notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "RiskPO" in printed and "riskpo" in printed  # the model card
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the risk-metrics plot
