"""The baseline study: RiskPO's paper advantage minus a per-prompt leave-one-out baseline
(``advantage_baseline="loo"``) against the paper's advantage, GRPO and the authors' advantage, in the exact protocol's
framework.

One command, resumable (every run is cached as JSON the moment it finishes; a rerun skips what is cached, and a
killed run simply starts again)::

    python -m benchmarks.lm_study.baseline_protocol                 # every run, then the report
    python -m benchmarks.lm_study.baseline_protocol --smoke         # trivial sizes for the test suite
    python -m benchmarks.lm_study.baseline_protocol --report-only   # the report from whatever runs are cached

Everything is fixed in :class:`~benchmarks.lm_study.config.BaselineProtocol`,
:data:`~benchmarks.lm_study.config.BASELINE_CLAIMS` and :data:`~benchmarks.lm_study.config.BASELINE_DEFAULT_RULE`
before the first run. Runs go one at a time (``--workers N``: N at once), each in a fresh process, in this order: the learning-rate grid from
both starts (seed 0), then seed by seed the chosen rate from both starts, then the equal-lr GRPO control. The
starts, their evaluations and the reference runs are the exact protocol's cached ones (``--reference``); at the
smoke size they are built and run here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.pipeline import Job, parse_study_args, run_jobs, study_parser

from .baseline_report import report
from .config import BaselineProtocol
from .exact_protocol import evaluated_starts, run_exact
from .plans import baseline_folder, baseline_path, baseline_runs


def jobs(protocol: BaselineProtocol, out: Path, reference: Path, dirs: dict[str, Path]) -> list[Job]:
    """The pipeline's jobs for every run :func:`~.plans.baseline_runs` names now: the exact protocol's runner, at
    this study's rates, in the run's folder."""
    return [
        Job(
            run.key,
            baseline_path(protocol, out, reference, run),
            run_exact,
            (protocol.exact, run, dirs[run.start], baseline_folder(protocol, out, reference, run)),
        )
        for run in baseline_runs(protocol, out, reference)
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_study_args(study_parser(__doc__, "lm_baseline", reference="lm_exact"), argv)
    protocol = BaselineProtocol().scaled_down() if args.smoke else BaselineProtocol()
    out, reference = args.out, args.reference
    if not args.report_only:
        dirs = evaluated_starts(protocol.exact, reference, args.smoke)
        run_jobs(lambda: jobs(protocol, out, reference, dirs), args.workers, "baseline")
    return report(protocol, out, reference)


if __name__ == "__main__":
    main()
