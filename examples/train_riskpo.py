"""Kept so existing commands work: the training script is `riskpo_trl.scripts.train` (console script `riskpo-train`)."""

from riskpo_trl.scripts.train import cli

if __name__ == "__main__":
    cli()
