"""Evaluation: Pass@k / Avg@k metrics, sampling backends, the offline evaluator with a scorer per benchmark kind
(math, geometry, code), the Pass@k training callback, diagnostics and figures.

Names are imported on first use, so ``riskpo-eval --help`` and ``riskpo-plot`` start without loading torch.
"""

from typing import Any

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
__all__ = sorted(name for names in _EXPORTS.values() for name in names)


def __getattr__(name: str) -> Any:
    module = next((module for module, names in _EXPORTS.items() if name in names), None)
    if module == "benchmarks":
        from . import benchmarks as source
    elif module == "callback":
        from . import callback as source
    elif module == "config":
        from . import config as source
    elif module == "evaluator":
        from . import evaluator as source
    elif module == "generation":
        from . import generation as source
    elif module == "metrics":
        from . import metrics as source
    elif module == "report":
        from . import report as source
    elif module == "sampling":
        from . import sampling as source
    elif module == "scorers":
        from . import scorers as source
    else:
        raise AttributeError(f"module 'riskpo_trl.evaluation' has no attribute {name!r}")
    return getattr(source, name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
