"""Every command the documentation shows names a script or module that exists and answers --help, and every script
of the repository answers --help without writing anything (no tracked file, no stray directory)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli_startup import console_scripts, entry_point_command

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONSOLE_SCRIPTS = console_scripts(ROOT / "pyproject.toml")
# Programs of other projects the docs tell you to run; only ours are checked.
EXTERNAL = {
    "pip",
    "apt-get",
    "dnf",
    "hf",
    "trl",
    "git",
    "cd",
    "sysctl",
    "export",
    "source",
    "nvidia-smi",
    "ls",
    "mkdir",
}
# Inline `code` in prose counts as a command when it starts like one of ours.
INLINE_COMMAND = re.compile(
    r"`((?:riskpo-(?:train|eval|plot)|python3? -m |python3? \S+\.py|accelerate launch \S|sbatch |\.\.\. -m |"
    r"examples/\S+\.(?:sh|py))[^`\n]*)`"
)
# Scripts meant to be run, by path (modules run with -m are found through the docs and the console scripts).
SCRIPT_DIRS = ("benchmarks", "docs", "examples")


def shell_commands(text: str) -> list[str]:
    """Commands of the fenced bash/sh blocks (continuations joined, comments dropped, split at && ; |) and of
    command-like inline code."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        heredoc_end = None
        for line in block.replace("\\\n", " ").splitlines():
            if heredoc_end is not None:  # the body of a here-document is another program's input
                heredoc_end = None if line.strip() == heredoc_end else heredoc_end
                continue
            heredoc = re.search(r"<<-?\s*['\"]?(\w+)", line)
            heredoc_end = heredoc.group(1) if heredoc else None
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in re.split(r"&&|;|\|", line) if part.strip()]
    commands += [match.strip() for match in INLINE_COMMAND.findall(text)]
    return commands


def command_target(command: str) -> tuple[str, str] | None:
    """``("console", name)``, ``("module", name)`` or ``("file", path)`` a command runs, or None for another
    project's program."""
    text = command.replace("[", " ").replace("]", " ")  # optional parts, as in `riskpo-train --help-all [--x y]`
    try:
        tokens = shlex.split(text)
    except ValueError:  # prose quoting (an apostrophe)
        tokens = text.split()
    tokens = [token for token in tokens if not re.fullmatch(r"[A-Za-z_]\w*=.*", token, re.S)]  # variables
    if not tokens:
        return None
    program = tokens[0]
    if program in CONSOLE_SCRIPTS:
        return "console", program
    if program in ("python", "python3", "accelerate", "sbatch", "bash", "..."):  # "...": an elided launcher
        for i, token in enumerate(tokens[1:], 1):
            if token in ("-c", "-") and program.startswith("python"):
                return None  # a program given inline
            if token == "-m":
                return "module", tokens[i + 1]
            if token.endswith((".py", ".sh")):
                return "file", token
        return "unknown", command
    if program.endswith((".py", ".sh")):
        return "file", program
    return None if program in EXTERNAL else ("unknown", command)


def documented_targets() -> dict[tuple[str, str], str]:
    targets = {}
    for path in DOCS:
        for command in shell_commands(path.read_text()):
            target = command_target(command)
            if target is not None:
                targets.setdefault(target, f"{path.name}: {command}")
    return targets


def help_command(kind: str, name: str) -> list[str]:
    if kind == "console":
        return entry_point_command(CONSOLE_SCRIPTS[name], name)
    if kind == "module":
        return [sys.executable, "-m", name, "--help"]
    return (["bash"] if name.endswith(".sh") else [sys.executable]) + [str(ROOT / name), "--help"]


def tracked_files() -> dict[str, float]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return {
        name: os.stat(ROOT / name).st_mtime for name in listed.decode().split("\0") if name and (ROOT / name).exists()
    }


def answer_help(kind: str, name: str, cwd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(help_command(kind, name), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_commands_are_found_in_code_blocks_and_prose():
    text = (
        "```bash\nA=1 riskpo-train --config x.yaml \\\n  --bundle_size 4 && python -m pytest -q  # tests\n"
        "python - <<'PY'\nimport os\nPY\n```\n"
        "Run `python -m benchmarks.overhead` or `accelerate launch -m riskpo_trl.scripts.train --config y`; "
        "the `python block` and `examples/data/x.jsonl` are not commands."
    )
    commands = shell_commands(text)
    assert [command_target(c) for c in commands] == [
        ("console", "riskpo-train"),
        ("module", "pytest"),
        None,
        ("module", "benchmarks.overhead"),
        ("module", "riskpo_trl.scripts.train"),
    ]
    assert command_target("pip install -e .") is None and command_target("frobnicate --x")[0] == "unknown"


DOCUMENTED = documented_targets()


def test_the_docs_show_the_main_commands():
    assert ("console", "riskpo-train") in DOCUMENTED and ("module", "riskpo_trl.scripts.train") in DOCUMENTED
    assert ("file", "docs/images/make_training_curves.py") in DOCUMENTED


@pytest.mark.parametrize("target", sorted(DOCUMENTED), ids=lambda target: target[1])
def test_every_documented_command_exists_and_answers_help(target, tmp_path_factory):
    kind, name = target
    where = DOCUMENTED[target]
    assert kind != "unknown", f"a command of an unknown program: {where}"
    if kind == "module":
        assert importlib.util.find_spec(name) is not None, f"no module {name} ({where})"
        if not name.startswith(("riskpo_trl", "benchmarks")):
            return  # another project's module (pytest): it exists, its --help is its own business
    elif kind == "file":
        assert (ROOT / name).is_file(), f"no file {name} ({where})"
    result = answer_help(kind, name, str(tmp_path_factory.mktemp("help")))
    assert result.returncode == 0, f"{where}\n{result.stderr[-2000:]}"
    assert (result.stdout + result.stderr).strip(), f"{where}: --help printed nothing"


def runnable_scripts() -> list[tuple[str, str]]:
    """Every Python file of the repository's script folders with a ``__main__`` entry (a module, ``-m``, when it is
    in a package), and every shell script."""
    found = []
    for folder in SCRIPT_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            name = str(path.relative_to(ROOT))
            if path.suffix == ".sh":
                found.append(("file", name))
            elif path.suffix == ".py" and 'if __name__ == "__main__"' in path.read_text():
                in_package = (path.parent / "__init__.py").is_file()
                found.append(("module", name[:-3].replace("/", ".")) if in_package else ("file", name))
    return found


@pytest.mark.parametrize("script", runnable_scripts(), ids=lambda script: script[1])
def test_every_script_answers_help_and_writes_nothing(script, tmp_path):
    before = tracked_files()
    result = answer_help(*script, str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert (result.stdout + result.stderr).strip(), "--help printed nothing"
    assert list(tmp_path.iterdir()) == []  # e.g. no directory named '--help'
    changed = [name for name, mtime in tracked_files().items() if before.get(name) != mtime]
    assert changed == [], f"{script} --help wrote {changed}"
