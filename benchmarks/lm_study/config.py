"""The tiny-LM study's shared settings: the methods, their labels, and :class:`LMConfig` (task, model, SFT and RL
sizes of the short protocol, which the long protocol overrides)."""

from __future__ import annotations

from dataclasses import dataclass, replace

METHODS = ("grpo", "gspo", "riskpo", "riskpo_authors", "risk_seeking", "riskpo_loo")
METHOD_LABELS = {
    "grpo": "GRPO (TRL defaults)",
    "gspo": "GSPO (sequence ratio)",
    "riskpo": "RiskPO (paper)",
    "riskpo_authors": "RiskPO, authors' DAPO advantage",
    "risk_seeking": "Risk-seeking",
    "riskpo_loo": "RiskPO (paper) + leave-one-out baseline",
}
AUTHORS_FIELDS = {
    "advantage_scaling": "authors_code",
    "quantile_source": "group",
    "natural_baseline": False,
    "credit_assignment": "sum_mean",
    "risk_omega": 1.5,
}
SELECTION_CRITERION = "mean of validation Pass@1 and Pass@16 over all buckets (ties: the smaller lr)"


@dataclass(frozen=True)
class LMConfig:
    """Every knob of the study, fixed before the first RL run."""

    # model: a config-built Qwen2 with the character tokenizer of riskpo_trl.tiny_model (the toy replication's size)
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    # task: a+b= with both operands of d digits, one bucket per d
    digits: tuple[int, ...] = (2, 3, 4)
    num_val_per_bucket: int = 50
    num_test_per_bucket: int = 100
    num_rl_train_per_bucket: int = 1000
    split_seed: int = 0
    # SFT (calibrated on the SFT start only, before the RL grid was fixed): stop at the first check where the easy
    # bucket's validation Pass@16 reaches sft_target_easy_pass16, or at sft_max_steps
    sft_lr: float = 2e-3
    sft_batch_size: int = 64
    sft_max_steps: int = 3000
    sft_eval_every: int = 100
    sft_target_easy_pass16: float = 0.8
    sft_pairs_per_bucket: int = 10_000  # cycled over epochs; tokenising more costs minutes
    # RL: identical for every method
    learning_rates: tuple[float, ...] = (1e-4, 3e-4, 1e-3)
    grid_seed: int = 0
    test_seeds: tuple[int, ...] = (0, 1, 2)
    generation_batches: int = 60  # 240 updates; sized so the study fits ~1 h on 2 busy cores
    prompts_per_generation: int = 20
    num_generations: int = 8
    updates_per_generation: int = 4
    bundle_size: int = 5
    temperature: float = 0.8
    max_completion_length: int = 7  # at most 5 digits, EOS, one slack token
    # evaluation (same sampling as training)
    eval_samples: int = 16
    ks: tuple[int, ...] = tuple(range(1, 17))
    eval_seed: int = 1234
    risk_alpha: float = 0.2  # level of the post hoc lower-tail RVaR, for every method

    def scaled_down(self) -> LMConfig:
        """Minimal sizes for the smoke test: seconds, not minutes. The numbers mean nothing."""
        return replace(
            self,
            hidden_size=16,
            intermediate_size=32,
            num_val_per_bucket=2,
            num_test_per_bucket=2,
            num_rl_train_per_bucket=20,
            sft_max_steps=2,
            sft_pairs_per_bucket=50,
            sft_eval_every=1,
            learning_rates=(1e-4,),
            test_seeds=(0, 1),
            generation_batches=1,
            prompts_per_generation=5,
            num_generations=4,
            updates_per_generation=2,
            eval_samples=2,
            ks=(1, 2),
        )


LONG_SELECTION_CRITERION = (
    "mean of the final validation Pass@1 and Pass@16 over all buckets (64 samples per problem; ties: the smaller lr)"
)


@dataclass(frozen=True)
class LongProtocol:
    """The long-horizon protocol, every knob fixed before its first RL run.

    Two starts: ``low`` is the short protocol's SFT start (re-created by the same code and seed), whose RL prompts
    (all three buckets) are mostly never solved; ``moderate`` is the paper's regime, where most prompts are neither
    all-right nor all-wrong: that SFT continued, same data and learning rate, until the ``moderate_bucket``-digit
    validation Pass@1 reaches ``moderate_target_pass1`` (checked every ``moderate_check_every`` steps with
    ``moderate_check_samples`` samples, at most ``moderate_max_steps``), with RL prompts from the
    ``moderate_rl_buckets`` only; validation and test keep every bucket, the others as a hard tail never trained on.
    (Calibrated on SFT alone, before any RL run from it: the first rule, "3-digit validation Pass@1 >= 0.3", left
    the 3-digit bucket at Pass@1 <= 0.006 over 2,100 more SFT steps while the 2-digit one passed 0.75; this model
    does not learn 3-digit sums in a budget that fits, so the moderate regime is made on the bucket it learns.)
    From each start, every method of ``core_methods`` trains at every
    learning rate of ``lm.learning_rates`` with ``lm.grid_seed``; the learning rate is chosen on validation by
    :data:`LONG_SELECTION_CRITERION`; the chosen one then runs with every seed of ``lm.test_seeds`` (``seeds_moderate``
    from the moderate start). ``optional_methods`` run last, after every core run of both starts.
    """

    lm: LMConfig = LMConfig(
        learning_rates=(3e-5, 1e-4),
        generation_batches=600,  # 10x the short protocol: 2400 updates
        eval_samples=64,
        ks=tuple(range(1, 65)),
    )
    starts: tuple[str, ...] = ("low", "moderate")
    core_methods: tuple[str, ...] = ("grpo", "gspo", "riskpo", "riskpo_authors")
    optional_methods: tuple[str, ...] = ("risk_seeking",)
    seeds_moderate: tuple[int, ...] = (0, 1, 2)
    # along training, on the validation split: Pass@k (k <= track_samples) and the sampling policy's token entropy
    eval_every: int = 25  # generation batches
    track_samples: int = 64
    # the moderate start
    moderate_bucket: int = 2
    moderate_target_pass1: float = 0.4
    moderate_rl_buckets: tuple[int, ...] = (2,)
    moderate_check_every: int = 100
    moderate_check_samples: int = 16
    moderate_max_steps: int = 6000
    # what counts as a collapse, for the verdicts and for choosing the regime guard's signal (fixed before the runs):
    # coverage collapse = validation Pass@64 over all buckets below this fraction of the start's;
    # entropy collapse = validation token entropy over all buckets below this fraction of the start's
    coverage_collapse_fraction: float = 0.5
    entropy_collapse_fraction: float = 0.25

    def scaled_down(self) -> LongProtocol:
        """Trivial sizes for the test suite: seconds per run, numbers mean nothing."""
        return replace(
            self,
            lm=replace(
                self.lm.scaled_down(), learning_rates=(1e-4, 3e-4), generation_batches=2, eval_samples=4, ks=(1, 2, 4)
            ),
            seeds_moderate=(0,),
            eval_every=1,
            track_samples=4,
            moderate_check_every=1,
            moderate_check_samples=2,
            moderate_max_steps=2,
        )


EXACT_VERDICT_RULE = (
    "A claim is supported only if the 95% two-level bootstrap CI (seeds, then the test problems, paired by problem) "
    "of its difference excludes 0 on the claimed side; contradicted if it excludes 0 on the other side; otherwise "
    "not significant. A row whose methods have fewer than all of the protocol's seeds is shown as interim, with the "
    "number of seeds it rests on."
)


@dataclass(frozen=True)
class ExactProtocol:
    """The exact-evaluation re-run of the long protocol's decisive comparisons, every knob fixed before its first run.

    Training is the long protocol's exactly (600 generation batches x 4 updates, 20 prompts x 8 completions, the
    same task splits and methods), except the grader: the strict token-level exact match
    (:class:`~benchmarks.lm_study.task.StrictExactMatch`), in training and evaluation alike, so that each problem's
    success probability is exact (:mod:`benchmarks.lm_study.exact`). Runs start from the committed SFT starts
    (:mod:`benchmarks.lm_study.starts`: the long protocol's two SFT rules with the exact validation probabilities in
    place of its sampled checks, so new weights: ``low`` stopped after 800 SFT steps, ``moderate`` 400 more), each
    method at the learning rate the long protocol chose on validation
    (``learning_rates``; no new grid), with ``seeds`` 0-4. Primary result: the final weights' exact test success
    probabilities (Pass@k = 1 - (1 - p)^k, k = 1..``max_k``). Also recorded: the exact validation probabilities
    every ``eval_every`` generation batches, the test probabilities of the best validation checkpoint (by
    ``LONG_SELECTION_CRITERION`` computed exactly), and the sampling policy's token entropy from ``entropy_samples``
    completions per problem, sampled with the run's own seed (:func:`run_eval_seed`). Statistics and verdicts:
    :data:`EXACT_VERDICT_RULE`, ``bootstrap_resamples`` resamples from ``bootstrap_seed``.
    """

    lm: LMConfig = LMConfig(learning_rates=(3e-5, 1e-4), generation_batches=600)
    starts: tuple[str, ...] = ("moderate", "low")
    methods: tuple[str, ...] = ("grpo", "riskpo", "gspo", "riskpo_authors")
    learning_rates: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = (
        ("low", (("grpo", 1e-4), ("gspo", 1e-4), ("riskpo", 3e-5), ("riskpo_authors", 3e-5))),
        ("moderate", (("grpo", 3e-5), ("gspo", 3e-5), ("riskpo", 3e-5), ("riskpo_authors", 3e-5))),
    )
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    eval_every: int = 25  # generation batches
    entropy_samples: int = 16
    max_k: int = 1024
    table_ks: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)
    bootstrap_resamples: int = 10_000
    bootstrap_seed: int = 0
    # the moderate start (same rule as the long protocol's, on the exact Pass@1)
    moderate_bucket: int = 2
    moderate_target_pass1: float = 0.4
    moderate_rl_buckets: tuple[int, ...] = (2,)
    moderate_check_every: int = 100
    moderate_max_steps: int = 6000

    def lr(self, start: str, method: str) -> float:
        return dict(dict(self.learning_rates)[start])[method]

    def train_buckets(self, start: str) -> tuple[int, ...] | None:
        return self.moderate_rl_buckets if start == "moderate" else None

    def scaled_down(self) -> ExactProtocol:
        """Trivial sizes for the test suite: seconds per run, numbers mean nothing."""
        return replace(
            self,
            lm=replace(self.lm.scaled_down(), generation_batches=2),
            seeds=(0, 1),
            methods=("grpo", "riskpo"),
            eval_every=1,
            entropy_samples=2,
            max_k=16,
            table_ks=(1, 16),
            bootstrap_resamples=200,
            moderate_check_every=1,
            moderate_max_steps=2,
        )


def run_eval_seed(start: str, method: str, seed: int) -> int:
    """Each run's own seed for what is still sampled in its evaluation (the entropy), fixed by its name."""
    import zlib

    return zlib.crc32(f"{start}/{method}/seed{seed}".encode())


@dataclass(frozen=True)
class Claim:
    """One row of the exact protocol's verdict table: ``a`` minus ``b`` (a method or ``"start"``) on the final test
    weights, from each start, judged by :data:`EXACT_VERDICT_RULE` with the claimed sign.

    ``metric``: ``"pass"`` = exact Pass@``k`` per problem (of ``bucket`` only, if given); ``"widening"`` = the
    per-problem Pass@``k`` minus Pass@1 (a gap that widens with k is a positive difference of these);
    ``"entropy"`` = the run's sampled test token entropy (seed level only)."""

    label: str
    a: str
    b: str
    metric: str
    k: int = 1
    bucket: int | None = None
    sign: int = 1


EXACT_CLAIMS: tuple[Claim, ...] = (
    Claim("RiskPO raises Pass@1 over GRPO", "riskpo", "grpo", "pass", 1),
    Claim("RiskPO raises Pass@64 over GRPO", "riskpo", "grpo", "pass", 64),
    Claim("RiskPO raises Pass@1024 over GRPO", "riskpo", "grpo", "pass", 1024),
    Claim("RiskPO raises Pass@64 over GSPO", "riskpo", "gspo", "pass", 64),
    Claim("The gap to GRPO widens in RiskPO's favour from k = 1 to k = 1024", "riskpo", "grpo", "widening", 1024),
    Claim("RiskPO's gain is on the hard tail: 4-digit Pass@64 over GRPO", "riskpo", "grpo", "pass", 64, bucket=4),
    Claim("RiskPO keeps entropy higher than GRPO", "riskpo", "grpo", "entropy"),
    Claim("GRPO's Pass@1024 falls below the start (boundary effect)", "grpo", "start", "pass", 1024, sign=-1),
    Claim("RiskPO's Pass@1024 ends above the start", "riskpo", "start", "pass", 1024),
    Claim("The authors' advantage raises Pass@64 over GRPO", "riskpo_authors", "grpo", "pass", 64),
)


# --- the baseline study: the paper's advantage minus a per-prompt leave-one-out baseline -----------------------------

BASELINE_DEFAULT_RULE = (
    "The default becomes advantage_baseline='loo' only if, from both starts, with every seed of the protocol at "
    "'loo''s chosen learning rate: 'loo' minus the paper's advantage is supported (EXACT_VERDICT_RULE) at Pass@64 "
    "and at Pass@1024, is not contradicted at Pass@1, and no 'loo' run of the study (the learning-rate grid's "
    "included) collapses, i.e. its tracked exact validation Pass@64 over all buckets falls below half the start's at "
    "any evaluation. Otherwise the default stays 'none', and the docs name every condition that failed."
)


@dataclass(frozen=True)
class BaselineProtocol:
    """The baseline study, every knob fixed before its first run: the exact protocol's starts, training, exact
    evaluation and :data:`EXACT_VERDICT_RULE` (``exact``), with ``method`` (RiskPO's paper advantage minus the
    per-prompt leave-one-out baseline) as the one new method.

    1. Learning rate: ``method`` trains with ``grid_seed`` at every rate of ``learning_rates`` from each start; per
       start the rate with the best final exact validation criterion (:data:`LONG_SELECTION_CRITERION` computed
       exactly, as the exact protocol's tracking does; ties: the smaller rate) is chosen. No test number is read.
    2. Seeds: the chosen rate runs with every seed of ``exact.seeds`` from each start (the grid's seed-0 run is
       reused).
    3. Equal-lr control: ``control_method`` at ``method``'s chosen rate from ``control_start``, every seed; the
       exact protocol's cached runs are reused where the rates match.
    4. References: the exact protocol's cached runs of ``references`` at its own rates, from both starts.
    5. Claims (:data:`BASELINE_CLAIMS`), each from both starts, by :data:`EXACT_VERDICT_RULE`; collapses by
       ``coverage_collapse_fraction``; the default by :data:`BASELINE_DEFAULT_RULE`.
    """

    exact: ExactProtocol = ExactProtocol()
    method: str = "riskpo_loo"
    learning_rates: tuple[float, ...] = (1e-5, 3e-5, 1e-4)
    grid_seed: int = 0
    control_start: str = "low"
    control_method: str = "grpo"
    references: tuple[str, ...] = ("riskpo", "grpo", "riskpo_authors")
    coverage_collapse_fraction: float = 0.5

    def scaled_down(self) -> BaselineProtocol:
        """Trivial sizes for the test suite: seconds per run, numbers mean nothing."""
        return replace(self, exact=self.exact.scaled_down(), learning_rates=(1e-5, 1e-4))


BASELINE_CLAIMS: tuple[Claim, ...] = (
    Claim("loo raises Pass@1 over the paper's advantage", "riskpo_loo", "riskpo", "pass", 1),
    Claim("loo raises Pass@64 over the paper's advantage", "riskpo_loo", "riskpo", "pass", 64),
    Claim("loo raises Pass@1024 over the paper's advantage", "riskpo_loo", "riskpo", "pass", 1024),
    Claim("loo raises Pass@1 over GRPO (GRPO at its own lr)", "riskpo_loo", "grpo", "pass", 1),
    Claim("loo raises Pass@64 over GRPO (GRPO at its own lr)", "riskpo_loo", "grpo", "pass", 64),
    Claim("loo raises Pass@1024 over GRPO (GRPO at its own lr)", "riskpo_loo", "grpo", "pass", 1024),
    Claim("loo raises Pass@1 over GRPO at loo's lr", "riskpo_loo", "grpo_equal_lr", "pass", 1),
    Claim("loo raises Pass@64 over GRPO at loo's lr", "riskpo_loo", "grpo_equal_lr", "pass", 64),
    Claim("loo raises Pass@1024 over GRPO at loo's lr", "riskpo_loo", "grpo_equal_lr", "pass", 1024),
    Claim("loo raises Pass@64 over the authors' advantage", "riskpo_loo", "riskpo_authors", "pass", 64),
    Claim("loo raises Pass@1024 over the authors' advantage", "riskpo_loo", "riskpo_authors", "pass", 1024),
    Claim("loo keeps test entropy higher than the paper's advantage", "riskpo_loo", "riskpo", "entropy"),
    Claim("loo keeps test entropy higher than GRPO (GRPO at its own lr)", "riskpo_loo", "grpo", "entropy"),
)
