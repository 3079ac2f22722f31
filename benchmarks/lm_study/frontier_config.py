"""The frontier study, pre-registered: RiskPO's variants against GRPO tuned the same way, judged at matched Pass@1.

Every knob, the frontier's definition, the outcomes and the verdict rule are fixed here before the study's first
run. The question: at the same exact test Pass@1, does a RiskPO variant keep more coverage (Pass@64, Pass@1024) than
GRPO? A smaller learning rate buys coverage for every method, so a single end point cannot answer it; the checkpoint
trajectory of each run can.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import ExactProtocol

FRONTIER_RATE_RULE = (
    "The paper's advantage ('riskpo', advantage_baseline='none') and the authors' advantage ('riskpo_authors') each "
    "get their learning rate by the baseline study's rule, per start: seed 0 at every rate of the grid 1e-5, 3e-5, "
    "1e-4; the rate with the best final exact validation criterion (mean of validation Pass@1 and Pass@16 over all "
    "buckets, computed exactly) is chosen; ties go to the smaller rate. The exact protocol's cached seed-0 runs at "
    "the same rate are reused; the other grid runs are new. No test number is read. GRPO and 'riskpo_loo' run at "
    "both 1e-5 and 3e-5; a method's frontier is taken over its rates."
)

FRONTIER_DEFINITION = (
    "Checkpoints: the start (checkpoint 0, the exact protocol's cached start evaluation), then every 5 generation "
    "batches up to 50, then every 25 up to 600. At each: exact test and validation success probabilities of every "
    "problem. Per run, the trajectory is (mean test Pass@1 over every test problem, each problem's test Pass@k). "
    "Matched Pass@1 level L, first crossing: the first checkpoint c whose Pass@1 is at least L; Pass@k at L is the "
    "linear interpolation between checkpoints c-1 and c with the weight that gives Pass@1 = L, the same weight "
    "applied to every problem (c = 0: the start's values). A run whose Pass@1 never reaches L has no value at L; "
    "later dips below L are ignored. An arm (a method at one rate) has a value at L only if every one of its seeds "
    "reaches L: its value is the seed mean. A method's frontier at L is the highest of its arms' values there, taken "
    "inside every bootstrap resample (the upper envelope over its rates)."
)

FRONTIER_OUTCOMES = (
    "Primary: test Pass@64, variant minus GRPO, each at its frontier, averaged over the Pass@1 levels of the start's "
    "pre-registered interval (a grid of step 0.001). Secondary: the same for Pass@1024. If GRPO or the variant does "
    "not reach part of the interval, the average is over the levels both reach (the interval is clipped to the "
    "common range) and the report names the clipped range; with no common level there is no verdict. End points "
    "(the final weights) are descriptive only."
)

FRONTIER_VERDICT_RULE = (
    "Per variant and start, for the primary and the secondary outcome: the 95% two-level bootstrap CI (each arm's "
    "seeds resampled independently, then the test problems, one draw shared by every arm: paired by problem). "
    "'better' if the CI lies entirely above +margin; 'worse' if entirely below -margin; 'equivalent' if entirely "
    "inside [-margin, +margin]; otherwise 'undecided'. A row resting on fewer than all of the protocol's seeds is "
    "marked interim, with the seeds it rests on."
)

FRONTIER_DEFAULT_NOTE = (
    "The default between advantage_baseline='none' and 'loo' stays decided by the baseline study's "
    "BASELINE_DEFAULT_RULE; this protocol does not change it."
)


@dataclass(frozen=True)
class FrontierProtocol:
    """The frontier study, every knob fixed before its first run (see the rule strings above).

    Training, starts, exact evaluation and entropy sampling are the exact protocol's (``exact``): 600 generation
    batches x 4 updates, 20 prompts x 8 completions, the strict grader, the committed SFT starts. Fresh ``seeds``
    (5-9) for every arm's comparison runs, so that no earlier look at the data chose the outcome.
    """

    exact: ExactProtocol = ExactProtocol()
    # arms at fixed rates; the frontier of a method is taken over its rates
    fixed_arms: tuple[tuple[str, tuple[float, ...]], ...] = (("grpo", (1e-5, 3e-5)), ("riskpo_loo", (1e-5, 3e-5)))
    # methods whose one rate comes from FRONTIER_RATE_RULE's grid
    ruled_methods: tuple[str, ...] = ("riskpo", "riskpo_authors")
    grid_rates: tuple[float, ...] = (1e-5, 3e-5, 1e-4)
    grid_seed: int = 0
    seeds: tuple[int, ...] = (5, 6, 7, 8, 9)
    reference: str = "grpo"
    variants: tuple[str, ...] = ("riskpo_loo", "riskpo", "riskpo_authors")
    # checkpoints (generation batches): every dense_every up to dense_until, then every sparse_every, and the last
    dense_every: int = 5
    dense_until: int = 50
    sparse_every: int = 25
    # The matched-Pass@1 interval per start (mean exact test Pass@1 over all test problems), fixed from the cached
    # exact and baseline runs before any new run: from just above the start's test Pass@1 (moderate 0.128, low
    # 0.088) to below the lowest final test Pass@1 of any cached seed at these rates (loo at 1e-5: moderate 0.146,
    # low 0.108) and below the validation peak gain of the paper's advantage at 3e-5, the arm that moves least.
    pass1_intervals: tuple[tuple[str, tuple[float, float]], ...] = (
        ("moderate", (0.130, 0.142)),
        ("low", (0.090, 0.102)),
    )
    pass1_step: float = 0.001
    primary_k: int = 64
    secondary_k: int = 1024
    margin: float = 0.01
    bootstrap_resamples: int = 10_000
    bootstrap_seed: int = 0
    # the stored exact probabilities keep this many significant digits (Pass@1024 needs relative, not absolute,
    # precision for tiny p; 6 digits change no reported number)
    stored_digits: int = 6

    def checkpoints(self) -> tuple[int, ...]:
        """The generation batches evaluated after the start (checkpoint 0)."""
        last = self.exact.lm.generation_batches
        batches = {
            b
            for b in range(1, last + 1)
            if (b <= self.dense_until and b % self.dense_every == 0) or b % self.sparse_every == 0
        }
        return tuple(sorted(batches | {last}))

    def pass1_levels(self, start: str) -> tuple[float, ...]:
        low, high = dict(self.pass1_intervals)[start]
        count = round((high - low) / self.pass1_step) + 1
        return tuple(round(low + i * self.pass1_step, 6) for i in range(count))

    def methods(self) -> tuple[str, ...]:
        return (*(m for m, _ in self.fixed_arms), *self.ruled_methods)

    def scaled_down(self) -> FrontierProtocol:
        """Trivial sizes for the test suite: seconds per run, numbers mean nothing."""
        return replace(
            self,
            exact=self.exact.scaled_down(),
            grid_rates=(1e-5, 1e-4),
            seeds=(5,),
            dense_every=1,
            dense_until=1,
            sparse_every=1,
            pass1_intervals=(("moderate", (0.0, 1.0)), ("low", (0.0, 1.0))),
            pass1_step=0.25,
            primary_k=4,
            secondary_k=16,
            bootstrap_resamples=200,
        )
