"""The instruction every math-style prompt carries (math and Geometry3K tracks, evaluation); a leaf module."""

from __future__ import annotations

# The standard Qwen2.5-Math / DeepSeek-R1-Distill instruction: reason, then box the answer. The paper does not print
# its prompt template; this is the usual one for the models it trains, and the math rewards read the boxed answer.
PROMPT_TEMPLATE = "{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def make_prompt(problem: str) -> list[dict[str, str]]:
    """The conversational prompt for one problem."""
    return [{"role": "user", "content": PROMPT_TEMPLATE.format(problem=problem.strip())}]
