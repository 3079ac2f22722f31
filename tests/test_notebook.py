"""The quickstart notebook runs top to bottom as the docs say to run it (`jupyter execute`, which the dev extra
installs), also as a copy outside the repository, so it cannot rot."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples/notebooks/quickstart.ipynb"
RUN_COMMAND = "jupyter execute examples/notebooks/quickstart.ipynb"


def data_cell() -> str:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    [cell] = [cell.source for cell in notebook.cells if cell.cell_type == "code" and "DATA_FILE =" in cell.source]
    return cell


def test_the_data_is_found_from_outside_the_repository_through_the_installed_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(data_cell(), namespace)
    assert namespace["DATA"] == ROOT / "examples/data/tiny_arithmetic.jsonl"


def test_without_a_checkout_the_notebook_says_what_it_needs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    installed = types.ModuleType("riskpo_trl")  # a regular install: no examples/ next to the package
    installed.__file__ = str(tmp_path / "site-packages" / "riskpo_trl" / "__init__.py")
    monkeypatch.setitem(sys.modules, "riskpo_trl", installed)
    with pytest.raises(
        FileNotFoundError,
        match=r"^examples/data/tiny_arithmetic.jsonl not found: this notebook reads "
        r"the file of that name in a riskpo-trl checkout\. .*`pip install -e \.`",
    ):
        exec(data_cell(), {})


def test_the_docs_run_it_with_what_the_dev_extra_installs():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert any(f"`{RUN_COMMAND}`" in path.read_text() for path in docs)
    assert not [path.name for path in docs if "nbconvert" in path.read_text()]
    # nbclient, in the dev extra, provides `jupyter execute`
    assert "jupyter-execute" in {entry.name for entry in importlib.metadata.entry_points(group="console_scripts")}


@pytest.mark.slow
def test_quickstart_notebook_executes_as_a_copy_outside_the_repository(tmp_path):
    copy = tmp_path / "quickstart.ipynb"
    shutil.copy(NOTEBOOK, copy)
    # The kernel must import this checkout's riskpo_trl.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    command = RUN_COMMAND.replace("examples/notebooks/quickstart.ipynb", "--inplace --timeout=120 quickstart.ipynb")
    result = subprocess.run(command.split(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    notebook = nbformat.read(copy, as_version=4)
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "RiskPO" in printed and "riskpo" in printed  # the model card
    assert "trained on `tiny_arithmetic.jsonl`" in printed and "openai/gsm8k" not in printed  # its real data
    assert "The base model is a tiny random model" in printed
    assert any("image/png" in o.get("data", {}) for o in outputs)  # the risk-metrics plot
