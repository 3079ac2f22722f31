"""Evaluation: Pass@k / Avg@k metrics, sampling backends, the offline evaluator with a scorer per benchmark kind
(math, geometry, code), the Pass@k training callback, diagnostics and figures.

Names are imported on first use, so ``riskpo-eval --help`` and ``riskpo-plot`` start without loading torch.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

# Public names by home module; each loads on first use. The TYPE_CHECKING block names the same for tools.
_EXPORTS = {
    "benchmarks": ("load_rows_file", "render_prompt", "resolve_benchmarks"),
    "callback": ("PassAtKCallback",),
    "config": ("EvalConfig",),
    "evaluator": ("evaluate",),
    "generation": ("TransformersBackend", "VLLMBackend", "load_backend"),
    "metrics": ("avg_at_k", "benchmark_metrics", "default_ks", "mean_pass_at_k", "pass_at_k", "pass_at_k_curve"),
    "report": ("markdown_table",),
    "sampling": ("Sample", "SamplingSettings"),
    "scorers": ("AnswerScorer", "CodeScorer", "score_samples", "scorer_for"),
}

if TYPE_CHECKING:
    from .benchmarks import load_rows_file, render_prompt, resolve_benchmarks
    from .callback import PassAtKCallback
    from .config import EvalConfig
    from .evaluator import evaluate
    from .generation import TransformersBackend, VLLMBackend, load_backend
    from .metrics import avg_at_k, benchmark_metrics, default_ks, mean_pass_at_k, pass_at_k, pass_at_k_curve
    from .report import markdown_table
    from .sampling import Sample, SamplingSettings
    from .scorers import AnswerScorer, CodeScorer, score_samples, scorer_for

__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
