# The quality gate, as TRL's: `make quality` checks, `make style` fixes. The rules and the files are in pyproject.toml.
# RUFF: the ruff of the dev extra (pip install -e ".[dev]"), or any other of the pinned version.
RUFF ?= ruff

.PHONY: quality style

quality:
	$(RUFF) check .
	$(RUFF) format --check .

style:
	$(RUFF) check --fix .
	$(RUFF) format .
