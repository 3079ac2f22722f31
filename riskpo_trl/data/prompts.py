"""The instructions math-style prompts carry (math and Geometry3K tracks, evaluation); a leaf module."""

from __future__ import annotations

from collections.abc import Callable

from ..registry import Registry

# The standard Qwen2.5-Math / DeepSeek-R1-Distill instruction: reason, then box the answer. The paper does not print
# its prompt template; this is the usual one for the models it trains, and the math rewards read the boxed answer.
PROMPT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

# The RiskPO authors' MATH/GSM8K data script (RTkenny/RiskPO data_processing/download_easymath.py) appends this to
# the question after one space, for both datasets. (Their DAPO runs keep DAPO-Math-17k's own prompt.)
AUTHORS_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def make_prompt(problem: str) -> list[dict[str, str]]:
    """The conversational prompt for one problem."""
    return [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=problem.strip())}]


def make_authors_prompt(problem: str) -> list[dict[str, str]]:
    """The authors' data script's prompt: ``{problem} Let's think step by step and output the final answer within
    \\boxed{}.``, the problem as the dataset has it (their script does not strip it)."""
    return [{"role": "user", "content": f"{problem} {AUTHORS_INSTRUCTION}"}]


# prompt_template name -> prompt builder for a problem; "authors" uses a dataset's own prompt where it ships one
# (riskpo_trl.data.DatasetSpec.own_prompt), as the authors' DAPO runs did.
PROMPT_BUILDERS: Registry[Callable[[str], list[dict[str, str]]]] = Registry("prompt_template")
PROMPT_BUILDERS.add("qwen_boxed", make_prompt, help="the Qwen2.5-Math / DeepSeek-R1-Distill instruction")
PROMPT_BUILDERS.add("authors", make_authors_prompt, help="the RiskPO authors' data script's instruction")
DEFAULT_PROMPT_TEMPLATE = "qwen_boxed"
