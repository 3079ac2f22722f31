"""The tiny-LM study's shared settings: the methods, their labels, and :class:`LMConfig` (task, model, SFT and RL
sizes of the short protocol, which the long protocol overrides)."""

from __future__ import annotations

from dataclasses import dataclass, replace

METHODS = ("grpo", "gspo", "riskpo", "riskpo_authors", "risk_seeking")
METHOD_LABELS = {
    "grpo": "GRPO (TRL defaults)",
    "gspo": "GSPO (sequence ratio)",
    "riskpo": "RiskPO (paper)",
    "riskpo_authors": "RiskPO, authors' DAPO advantage",
    "risk_seeking": "Risk-seeking",
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
            lm=replace(self.lm.scaled_down(), learning_rates=(1e-4, 3e-4), generation_batches=2, eval_samples=4,
                       ks=(1, 2, 4)),
            seeds_moderate=(0,),
            eval_every=1,
            track_samples=4,
            moderate_check_every=1,
            moderate_check_samples=2,
            moderate_max_steps=2,
        )
