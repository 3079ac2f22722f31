"""Math rewards: final-answer grading, unscorable gold answers, worker threads and the registry."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from riskpo_trl.rewards import (
    REWARD_FUNCS,
    boxed_format_reward,
    get_reward_funcs,
    last_boxed,
    math_verify_reward,
    verify_answer,
)


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        (r"So the result is \boxed{42}.", "42", 1.0),
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        (r"First I guessed \boxed{3}, but correcting: \boxed{42}", "42", 1.0),  # the last box is the final answer
        (r"First \boxed{42}, then the final \boxed{3}", "42", 0.0),
        ("The answer is 42", "42", 1.0),  # plain form, no box
        ("Natalia sold 48/2 = 24 clips in May. 48+24 = 72. Answer: 72", "72", 1.0),  # GSM8K style
        (r"\boxed{43}", "42", 0.0),
        ("I have no idea.", "42", 0.0),
        ("", "42", 0.0),
        (r"\boxed{2^{1009}}", "$2^{1009}$", 1.0),  # OlympiadBench-style gold with dollars
        (r"the answer is \boxed{", "42", 0.0),  # truncated completion
    ],
)
def test_verify_answer(text, gold, expected):
    assert verify_answer(text, gold) == expected


# Completions a real model (SmolLM2-135M-Instruct, 64 tokens) wrote or could write: an answer at an anchor pays, a
# number in mid-text (a completion clipped mid-reasoning, a trailing check) does not.
@pytest.mark.parametrize(
    ("text", "expected", "read"),
    [
        ("The farmer has 15 cows and buys 9 more: 15 + 9 = 24 cows.\n\nLet's break", 0.0, "-"),
        ("She packs 10 boxes of 7.\ncheck: 10 * 7", 0.0, "-"),
        ("15 + 9 = 24 cows.", 0.0, "-"),
        ("15 + 9 = 24, so the total is \\boxed{24}.", 1.0, "24"),
        ("15 + 9 = 24.\nThe answer is 24.", 1.0, "24."),
        ("15 + 9 = 24\nAnswer: 24", 1.0, "24"),
        ("15 + 9 = 24\n#### 24", 1.0, "24"),
        ("15 + 9 = 24\n\n24", 1.0, "24"),  # the final line, an answer on its own
        ("The answer is 20.\nNo wait: 15 + 9 = 24 cows.\n\nLet's break", 0.0, "20."),  # the last anchor is read
    ],
)
def test_only_an_anchored_answer_is_graded(text, expected, read):
    gold = "24"
    assert verify_answer(text, gold) == expected
    logged = {}
    math_verify_reward([text], solution=[gold], log_extra=lambda name, values: logged.update({name: values}))
    assert logged["final_answer"] == [read]  # what the grader read, or "-"


def test_a_trailing_expression_is_no_answer_even_when_it_evaluates_to_the_gold():
    assert verify_answer("She packs 10 boxes of 7 pens.\ncheck: 10 * 7", "70") == 0.0
    assert verify_answer("She packs 10 boxes of 7 pens.\nAnswer: 10 * 7", "70") == 1.0


@pytest.mark.parametrize("gold", ["", "   ", "???"])
def test_unparseable_gold_is_unscorable_not_wrong(gold):
    assert verify_answer(r"\boxed{1}", gold) is None


def test_malformed_gold_never_raises():
    # Unbalanced LaTeX must give a score or None, never an exception.
    for gold in [r"\frac{1}{", "}}}{{{", r"\sqrt", "\\"]:
        assert verify_answer(r"\boxed{1}", gold) in (None, 0.0, 1.0)


def test_last_boxed_balances_braces():
    assert last_boxed(r"x \boxed{\frac{1}{2}} y") == r"\frac{1}{2}"
    assert last_boxed("no box") is None
    assert last_boxed(r"\boxed{unclosed") is None


def test_math_verify_reward_reads_both_completion_formats_and_logs():
    logged = {}
    completions = [
        [{"role": "assistant", "content": r"\boxed{4}"}],
        r"\boxed{5}",
        [{"role": "assistant", "content": r"\boxed{4}"}],
    ]
    rewards = math_verify_reward(
        completions, solution=["4", "4", ""], log_extra=lambda name, values: logged.update({name: values})
    )
    assert rewards == [1.0, 0.0, None]
    assert logged["final_answer"] == ["4", "5", "4"]


def test_math_verify_reward_in_worker_threads():
    """math-verify's signal timeouts fail off the main thread; the reward must still grade there."""
    assert threading.current_thread() is threading.main_thread()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda t: verify_answer(*t), [(r"\boxed{7}", "7"), (r"\boxed{8}", "7")] * 3))
    assert results == [1.0, 0.0] * 3


def test_boxed_format_reward():
    completions = [r"Reasoning... \boxed{3}.", r"\boxed{3} and then more text", "3"]
    assert boxed_format_reward(completions) == [1.0, 0.0, 0.0]


def test_registry_resolves_names_in_order():
    assert get_reward_funcs(["boxed_format", "math_verify"]) == [boxed_format_reward, math_verify_reward]
    assert get_reward_funcs("math_verify") == [math_verify_reward]


def test_unknown_reward_name_is_named_with_valid_choices():
    with pytest.raises(ValueError) as error:
        get_reward_funcs(["math_verify", "acuracy"])
    message = str(error.value)
    assert "acuracy" in message
    for name in REWARD_FUNCS:
        assert name in message


def test_completion_text_reads_strings_messages_and_content_blocks():
    from riskpo_trl.rewards import completion_text

    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "x = 1"}]) == "x = 1"
    blocks = [{"role": "assistant", "content": [{"type": "text", "text": r"\boxed{2}"}, {"type": "image"}]}]
    assert completion_text(blocks) == r"\boxed{2}"
