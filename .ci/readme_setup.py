"""Print the commands of the README's "Set up and try it" block, one a line, so CI runs exactly what a newcomer runs.

    python .ci/readme_setup.py setup   # every line before the test command (installs, first training run)
    python .ci/readme_setup.py test    # the test command
    python .ci/readme_setup.py own_data   # the own-data block of "Training with recipes", run after the set-up

Standard library only: it runs before any environment exists. Comments after ` #` are dropped, and a line ending
in a backslash is joined with the next.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Set up and try it"
TEST_COMMAND = re.compile(r"python3? -m pytest\b")
OWN_DATA = "Your own data trains as it is"


def block_commands(text: str) -> list[str]:
    """The commands of the first bash block of the set-up section."""
    start = text.find(f"\n{SECTION}\n")
    if start < 0:
        raise SystemExit(f"README.md has no '{SECTION}' section")
    section = text[start + len(SECTION) + 1 :]
    section = section[: section.find("\n## ")] if "\n## " in section else section
    return _commands(section, f"README.md's '{SECTION}' section")


def own_data_commands(text: str) -> list[str]:
    """The commands of the first bash block after the paragraph that starts with :data:`OWN_DATA`."""
    start = text.find(OWN_DATA)
    if start < 0:
        raise SystemExit(f"README.md has no paragraph starting '{OWN_DATA}'")
    return _commands(text[start:], f"README.md's '{OWN_DATA}' paragraph")


def _commands(text: str, where: str) -> list[str]:
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    if block is None:
        raise SystemExit(f"{where} has no ```bash block")
    commands = []
    for line in block.group(1).replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def split(commands: list[str]) -> tuple[list[str], str]:
    """(set-up commands, test command): the block must end with exactly one test command."""
    tests = [command for command in commands if TEST_COMMAND.match(command)]
    if len(tests) != 1 or commands[-1] != tests[0]:
        raise SystemExit(f"README.md's '{SECTION}' block must end with its one `python -m pytest` command: {commands}")
    return commands[:-1], tests[0]


def main(argv: list[str]) -> None:
    if argv not in (["setup"], ["test"], ["own_data"]):
        raise SystemExit(__doc__)
    text = README.read_text()
    if argv == ["own_data"]:
        print("\n".join(own_data_commands(text)))
        return
    setup, test = split(block_commands(text))
    print("\n".join(setup) if argv == ["setup"] else test)


if __name__ == "__main__":
    main(sys.argv[1:])
