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


def keep_text(problem: str) -> str:
    """The ``raw`` template: a dataset's own text prompt as it is, no chat turn and no instruction."""
    return problem


# prompt_template name -> prompt builder for a problem; "authors" uses a dataset's own prompt where it ships one
# (riskpo_trl.data.DatasetSpec.own_prompt), as the authors' DAPO runs did. "raw" applies to a text prompt column of a
# dataset used as it is (for a model without a chat template); the registered datasets refuse it.
PROMPT_BUILDERS: Registry[Callable[[str], list[dict[str, str]] | str]] = Registry("prompt_template")
PROMPT_BUILDERS.add("qwen_boxed", make_prompt, help="the Qwen2.5-Math / DeepSeek-R1-Distill instruction")
PROMPT_BUILDERS.add("authors", make_authors_prompt, help="the RiskPO authors' data script's instruction")
PROMPT_BUILDERS.add("raw", keep_text, help="a text prompt column as it is: no chat turn, no instruction")
DEFAULT_PROMPT_TEMPLATE = "qwen_boxed"
RAW_PROMPT_TEMPLATE = "raw"


def check_not_raw(prompt_template: str, name: str) -> None:
    """``raw`` keeps a text prompt column as it is; a registered dataset builds chat prompts from its problems."""
    if prompt_template == RAW_PROMPT_TEMPLATE:
        raise ValueError(
            f"prompt_template='raw' keeps the text prompt column of a dataset used as it is; {name!r} is registered "
            f"and builds chat prompts from its problems. Use {DEFAULT_PROMPT_TEMPLATE!r} or 'authors'."
        )


def prompt_from_text(text: str, prompt_template: str = DEFAULT_PROMPT_TEMPLATE) -> list[dict[str, str]] | str:
    """A text prompt (a string prompt column of a dataset used as it is) prompted as a registered dataset prompts its
    problem: a user turn with ``prompt_template``'s instruction; ``raw``: the text as it is."""
    return PROMPT_BUILDERS[prompt_template](text)


# The instructions the templates above write. A chat template that already writes one by itself (Qwen2.5-Math-Instruct's
# default system turn is qwen_boxed's instruction) would show the model the same instruction twice.
TEMPLATE_INSTRUCTIONS = (PROMPT_TEMPLATE.format(problem="").strip(), AUTHORS_INSTRUCTION)


def instruction_in_chat_template(tokenizer) -> str | None:
    """The instruction of :data:`TEMPLATE_INSTRUCTIONS` that ``tokenizer``'s chat template writes by itself, around an
    empty user turn (a default system turn); None if it writes none, or the tokenizer has no chat template."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": ""}], tokenize=False, add_generation_prompt=True
    )
    return next((instruction for instruction in TEMPLATE_INSTRUCTIONS if instruction in rendered), None)


def without_instruction(prompt: list[dict[str, str]] | str, instruction: str | None) -> list[dict[str, str]] | str:
    """``prompt`` with ``instruction`` taken off the end of its user turns (the chat template writes it already);
    a text prompt, or no instruction, leaves it as it is."""
    if instruction is None or isinstance(prompt, str):
        return prompt
    return [
        {**message, "content": message["content"].removesuffix(instruction).rstrip()}
        if message.get("role") == "user" and isinstance(message.get("content"), str)
        else message
        for message in prompt
    ]
