"""CI installs what the README's "Set up and try it" block says: `.ci/run` reads that block through
`.ci/readme_setup.py` and runs it in a fresh venv, so these check the reader and that the block keeps its shape."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("readme_setup", ROOT / ".ci" / "readme_setup.py")
readme_setup = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_setup)


def readme_commands(which: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "readme_setup.py"), which], capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_the_readme_installs_torch_first_then_the_dev_extra_then_tests():
    setup = readme_commands("setup")
    installs = [part.strip() for line in setup for part in line.split("&&") if part.strip().startswith("pip ")]
    assert installs[0].startswith("pip install torch==2.13.0"), setup
    assert installs[1] == 'pip install -e ".[dev]"', setup
    assert readme_commands("test") == ["python -m pytest -q"]


def test_the_reader_takes_the_set_up_sections_first_bash_block():
    text = (
        "# x\n```bash\npip install wrong\n```\n"
        "## Set up and try it\n\nProse.\n\n```bash\n# a comment line\npip install a   # a trailing comment\n"
        "pip install b \\\n    c\npython -m pytest -q\n```\n\n```bash\npip install later\n```\n"
        "## Next\n```bash\npip install other\n```\n"
    )
    commands = readme_setup.block_commands(text)
    assert commands == ["pip install a", "pip install b      c", "python -m pytest -q"]
    assert readme_setup.split(commands) == (["pip install a", "pip install b      c"], "python -m pytest -q")


@pytest.mark.parametrize(
    "commands",
    [["pip install a"], ["python -m pytest -q", "pip install a"], ["python -m pytest -q", "python -m pytest -q"]],
)
def test_the_reader_refuses_a_block_that_does_not_end_in_one_test_command(commands):
    with pytest.raises(SystemExit, match="must end with its one `python -m pytest` command"):
        readme_setup.split(commands)


def test_the_reader_names_a_missing_section():
    with pytest.raises(SystemExit, match="no '## Set up and try it' section"):
        readme_setup.block_commands("# README\n```bash\npip install a\n```\n")


def test_ci_runs_the_readme_commands_in_a_fresh_venv():
    script = (ROOT / ".ci" / "run").read_text()
    assert "python .ci/readme_setup.py setup" in script and "python .ci/readme_setup.py test" in script
    assert '-m venv "$WORK/venv"' in script and "mktemp -d" in script


def test_ci_runs_the_suite_in_the_checkout_the_readme_commands_left():
    """A newcomer runs the README's block top to bottom in one checkout: the suite must pass with the first run's
    outputs/ in place, so CI leaves it there (the tests use their own temporary directories)."""
    script = (ROOT / ".ci" / "run").read_text()
    assert "mv outputs" not in script and "outputs.yours" not in script
