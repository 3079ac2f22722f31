"""The authors' graders (verl 0.4.1's stock scorers): each case is one where it and math-verify disagree, or one of
the rules that make it differ (expected values worked out from the rules of verl's gsm8k.py, math.py and
math_dapo.py, not from a run)."""

from __future__ import annotations

import pytest
from helpers import make_prompt_dataset, tiny_config

from riskpo_trl import RiskPOTrainer, job
from riskpo_trl.rewards import (
    REWARD_FUNCS,
    verify_answer,
    verl_by_source_reward,
    verl_gsm8k_reward,
    verl_math_dapo_reward,
    verl_math_reward,
)
from riskpo_trl.rewards.verl_graders import (
    dapo_answer_score,
    gsm8k_strict_score,
    hendrycks_normalise,
    math_equiv_score,
    minerva_normalise,
)

# (completion, gold, verl's GSM8K strict score, math-verify's)
GSM8K_CASES = [
    (r"48 + 24 = 72, so the answer is \boxed{72}.", "72", 0.0, 1.0),  # what the authors' prompt asks for: 0
    ("48 + 24 = 72\n#### 72", "72", 1.0, 1.0),
    ("#### 72.0", "72", 0.0, 1.0),  # a string comparison
    ("####72", "72", 0.0, None),  # the space after #### is required
    ("#### 1,200", "1200", 1.0, 1.0),  # commas dropped
    ("#### 72 " + "and then some more words. " * 15, "72", 0.0, 0.0),  # not in the last 300 characters (either)
    ("#### 5 ... on reflection #### 72", "72", 1.0, 1.0),  # the last one counts
]


@pytest.mark.parametrize(("text", "gold", "verl", "math_verify"), GSM8K_CASES)
def test_gsm8k_strict_grader_against_math_verify(text, gold, verl, math_verify):
    assert gsm8k_strict_score(text, gold) == verl
    assert math_verify is None or verify_answer(text, gold) == math_verify


# (completion, gold, verl's MATH score, math-verify's)
MATH_CASES = [
    (r"\boxed{\frac12}", r"\frac{1}{2}", 1.0, 0.0),  # \frac12 -> \frac{1}{2}; math-verify needs the braces
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0, 1.0),  # the one decimal the rules turn into a fraction
    (r"\boxed{0.50}", r"\frac{1}{2}", 0.0, 1.0),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", 0.0, 1.0),  # no algebra
    (r"\boxed{5.0}", "5", 0.0, 1.0),
    (r"\boxed{1/2}", r"\frac{1}{2}", 1.0, 1.0),  # a/b -> \frac{a}{b}
    (r"\boxed{x = 5}", "5", 1.0, 1.0),  # a short "x =" is dropped
    (r"\boxed{\dfrac{\sqrt3}{2}}", r"\frac{\sqrt{3}}{2}", 1.0, 0.0),  # \sqrt3 -> \sqrt{3} (math-verify: no)
    (r"\boxed{90^\circ}", "90", 1.0, 1.0),
    (r"\boxed{5 \text{ cm}}", "5", 1.0, 1.0),  # a unit after "\text{ " is dropped
    (r"\fbox{5}", "5", 0.0, 1.0),  # verl reads \fbox but cannot unwrap it
    (r"the answer is \boxed 5$.", "5", 1.0, 1.0),  # the space form
    ("The answer is 5", "5", 0.0, 1.0),  # no box, no answer
    (r"\boxed{\pi/2}", r"\frac{\pi}{2}", 0.0, 1.0),
]


@pytest.mark.parametrize(("text", "gold", "verl", "math_verify"), MATH_CASES)
def test_math_grader_against_math_verify(text, gold, verl, math_verify):
    assert math_equiv_score(text, gold) == verl
    assert verify_answer(text, gold) == math_verify


def test_math_normalisation_failures_fall_back_to_raw_equality():
    # a trailing \sqrt cannot be braced: verl compares the raw strings then
    assert math_equiv_score(r"\boxed{2\sqrt}", r"2\sqrt") == 1.0
    assert math_equiv_score(r"\boxed{2 \sqrt}", r"2\sqrt") == 0.0
    assert hendrycks_normalise(r"\left( 1, 2 \right)") == "(1,2)"


# (completion, gold, verl's DAPO score, math-verify's)
DAPO_CASES = [
    ("Reasoning...\nAnswer: 34", "34", 1.0, 1.0),
    (r"Reasoning... so the answer is \boxed{34}.", "34", -1.0, 1.0),  # no Answer: line: -1, not 0
    ("answer : $34$", "34", 1.0, 1.0),  # any case, spaces, dollars
    ("**Answer:** 34", "34", -1.0, 1.0),  # the bold markers stay in the answer
    ("Answer: x = 34", "34", 1.0, 1.0),  # what follows the last "="
    ("Answer: 34 degrees", "34", 1.0, 1.0),  # unit words dropped
    ("Answer: 0.5", r"\frac{1}{2}", -1.0, 1.0),
    ("Answer: \\frac12", r"\frac{1}{2}", 1.0, 0.0),  # frac12 -> frac{1}{2} (math-verify: no)
    ("Answer: 1,000", "1000", 1.0, 1.0),
    ("Answer: 12\nAnswer: 34", "34", 1.0, 1.0),  # the last one counts
    ("Answer: 34\n" + "Let me double-check this. " * 15, "34", -1.0, 0.0),  # not in the last 300 characters
]


@pytest.mark.parametrize(("text", "gold", "verl", "math_verify"), DAPO_CASES)
def test_dapo_grader_against_math_verify(text, gold, verl, math_verify):
    assert dapo_answer_score(text, gold) == verl
    assert verify_answer(text, gold) == math_verify


def test_minerva_normalisation():
    assert minerva_normalise(r"$\text{(A) } 5$") == "(A)5"
    assert minerva_normalise(r"\boxed{\frac{3}{4}}") == r"\frac{3}{4}"
    assert minerva_normalise("1,234,567") == "1234567"


def test_rewards_are_registered_and_read_messages():
    assert {name: REWARD_FUNCS[name] for name in ("verl_gsm8k", "verl_math", "verl_math_dapo", "verl_by_source")} == {
        "verl_gsm8k": verl_gsm8k_reward,
        "verl_math": verl_math_reward,
        "verl_math_dapo": verl_math_dapo_reward,
        "verl_by_source": verl_by_source_reward,
    }
    completions = [[{"role": "assistant", "content": r"\boxed{72}"}], [{"role": "assistant", "content": "#### 72"}]]
    logged = {}
    assert verl_gsm8k_reward(completions, ["72", "72"], log_extra=logged.__setitem__) == [0.0, 1.0]
    assert logged == {"final_answer": ["-", "72"]}  # "-": the grader read no answer
    assert verl_math_reward(completions, ["72", "72"]) == [1.0, 0.0]
    assert verl_math_dapo_reward(["Answer: 72", "72"], ["72", "72"]) == [1.0, -1.0]


def test_verl_by_source_grades_each_row_by_its_source_as_verl():
    text = r"So 72. \boxed{72}" + "\nAnswer: 72"
    sources = ["openai/gsm8k", "DigitalLearningGmbH/MATH-lighteval", "BytedTsinghua-SIA/DAPO-Math-17k", "aime_2024"]
    assert verl_by_source_reward([text] * 4, ["72"] * 4, sources) == [0.0, 1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="no grader for data_source='HuggingFaceH4/MATH-500'.*verl_math"):
        verl_by_source_reward([text], ["72"], ["HuggingFaceH4/MATH-500"])


def test_trainer_refuses_a_dataset_whose_source_verl_by_source_cannot_grade(tiny_model_dir, tmp_path):
    dataset = make_prompt_dataset(5)
    args = tiny_config(tmp_path, run=False, report_to="none", num_generations=2, bundle_size=1)
    with pytest.raises(ValueError, match="reads the column.*data_source"):
        job.build(RiskPOTrainer, tiny_model_dir, reward_funcs=verl_by_source_reward, args=args, train_dataset=dataset)
    unknown = dataset.add_column("data_source", ["openai/gsm8k"] * 4 + ["my/dataset"])
    with pytest.raises(
        ValueError,
        match="training dataset does not fit the reward function verl_by_source_reward.*data_source='my/dataset'",
    ):
        job.build(RiskPOTrainer, tiny_model_dir, reward_funcs=verl_by_source_reward, args=args, train_dataset=unknown)


def test_percent_signs_are_removed_twice_as_verls_strip_string_does():
    # verl's strip_string has two identical `replace("\\%", "")` calls, so a `\%` that the first one forms is removed
    # too: 5\\\%% -> (\\ to \) 5\\%% -> (first) 5\% -> (second) 5.
    assert hendrycks_normalise(r"5\\\%%") == "5"
    assert math_equiv_score(r"The answer is \boxed{5\\\%%}", "5") == 1.0
    assert hendrycks_normalise(r"50\%") == "50"  # a plain percent sign: the first call already removes it
