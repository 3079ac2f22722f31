"""Code dataset adapters on rows written in the real schemas, scored end-to-end through the sandbox."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest

from riskpo_trl.code.data import (
    LIVECODEBENCH_RELEASE_FILES,
    archer_to_riskpo,
    decode_livecodebench_tests,
    livecodebench_to_riskpo,
)
from riskpo_trl.code.reward import CodeReward
from riskpo_trl.code.sandbox import Sandbox, SandboxLimits
from riskpo_trl.code.testspec import TestSpec


def fenced(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"<think>plan</think>\n```python\n{program}\n```"}]


@pytest.fixture(scope="module")
def reward() -> CodeReward:
    return CodeReward(sandbox=Sandbox(SandboxLimits(test_timeout_s=2, total_timeout_s=6), max_workers=2))


def compress(cases: list[dict]) -> str:
    """How LiveCodeBench stores large private test sets: base64(zlib(pickle(json string)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


LCB_STDIN_ROW = {
    "question_title": "Sum of two",
    "question_content": "Given two integers A and B, print A+B.",
    "platform": "atcoder",
    "question_id": "abc000_a",
    "contest_id": "abc000",
    "contest_date": "2024-09-01T00:00:00",
    "starter_code": "",
    "difficulty": "easy",
    "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
    "private_test_cases": compress([{"input": "10 -4\n", "output": "6\n", "testtype": "stdin"}]),
    "metadata": "{}",
}
LCB_FUNCTIONAL_ROW = {
    **LCB_STDIN_ROW,
    "platform": "leetcode",
    "question_content": "Return the maximum of nums.",
    "starter_code": "class Solution:\n    def maxOf(self, nums: List[int]) -> int:\n        ",
    "public_test_cases": json.dumps([{"input": "[3, 9, 2]", "output": "9", "testtype": "functional"}]),
    "private_test_cases": json.dumps([{"input": "[-5]", "output": "-5", "testtype": "functional"}]),
    "metadata": json.dumps({"func_name": "maxOf"}),
}


def test_livecodebench_stdin_row_with_compressed_private_tests(reward):
    with pytest.raises(ValueError, match="allow_pickle"):
        livecodebench_to_riskpo(LCB_STDIN_ROW)
    row = livecodebench_to_riskpo(LCB_STDIN_ROW, allow_pickle=True)
    spec = TestSpec.from_json(row["tests"])
    assert (spec.style, spec.inputs, spec.outputs) == ("stdin", ["1 2\n", "10 -4\n"], ["3\n", "6\n"])
    assert "A+B" in row["prompt"][0]["content"] and "standard input" in row["prompt"][0]["content"]
    good, public_only = "print(sum(map(int, input().split())))", "print(3)"
    assert reward([fenced(good), fenced(public_only)], [row["tests"]] * 2) == [1.0, 0.0]


def test_livecodebench_functional_row(reward):
    row = livecodebench_to_riskpo(LCB_FUNCTIONAL_ROW)
    spec = TestSpec.from_json(row["tests"])
    assert (spec.style, spec.fn_name, spec.outputs) == ("functional", "maxOf", ["9", "-5"])
    assert "def maxOf" in row["prompt"][0]["content"]
    good = "class Solution:\n    def maxOf(self, nums: List[int]) -> int:\n        return max(nums)"
    wrong = "class Solution:\n    def maxOf(self, nums):\n        return nums[0]"
    assert reward([fenced(good), fenced(wrong)], [row["tests"]] * 2) == [1.0, 0.0]


def test_decode_plain_json_private_tests():
    cases = [{"input": "x", "output": "y", "testtype": "stdin"}]
    assert decode_livecodebench_tests(json.dumps(cases)) == cases


def test_release_files_match_the_dataset_script():
    assert LIVECODEBENCH_RELEASE_FILES["release_v5"] == [
        "test.jsonl",
        "test2.jsonl",
        "test3.jsonl",
        "test4.jsonl",
        "test5.jsonl",
    ]


ARCHER_STDIN_ROW = {  # verl-style row, as in archercoder-1.5b-train.json
    "data_source": "code",
    "prompt": [{"role": "user", "content": "Read n and print n squared. Answer in a ```python block."}],
    "ability": "code",
    "reward_model": {
        "style": "rule",
        "ground_truth": json.dumps({"inputs": ["3\n", "12\n"], "outputs": ["9\n", "144\n"]}),
    },
    "extra_info": {"index": 0},
}
ARCHER_FUNCTIONAL_ROW = {  # top-level ground_truth with LeetCode check code, as in Archer2.0-Code
    "prompt": "Implement Solution.addOne(x) returning x + 1.",
    "ground_truth": json.dumps(
        {
            "functional": "def check(candidate):\n    assert candidate(1) == 2\n"
            "    assert candidate(-1) == 0\n\ncheck(Solution().addOne)"
        }
    ),
    "ability": "code",
}
ARCHER_LCB_ROW = {
    "data_source": "livecodebench_v5",
    "prompt": [{"role": "user", "content": "Return the maximum of nums."}],
    "reward_model": {
        "style": "rule",
        "ground_truth": json.dumps(
            [{"input": "[1, 4]", "output": "4", "testtype": "functional", "metadata": {"func_name": "maxOf"}}]
        ),
    },
}


def test_archer_rows_in_each_ground_truth_format(reward):
    rows = [archer_to_riskpo(r) for r in (ARCHER_STDIN_ROW, ARCHER_FUNCTIONAL_ROW, ARCHER_LCB_ROW)]
    styles = [TestSpec.from_json(r["tests"]).style for r in rows]
    assert styles == ["stdin", "assert", "functional"]
    assert rows[1]["prompt"] == [{"role": "user", "content": ARCHER_FUNCTIONAL_ROW["prompt"]}]
    programs = [
        "n = int(input())\nprint(n * n)",
        "class Solution:\n    def addOne(self, x):\n        return x + 1",
        "class Solution:\n    def maxOf(self, nums):\n        return max(nums)",
    ]
    wrong = ["print(9)", "class Solution:\n    def addOne(self, x):\n        return x", "def maxOf(nums): return 1"]
    tests = [r["tests"] for r in rows]
    assert reward([fenced(p) for p in programs + wrong], tests * 2) == [1.0] * 3 + [0.0] * 3


def test_archer_row_without_ground_truth_names_the_field():
    with pytest.raises(ValueError, match="ground_truth"):
        archer_to_riskpo({"prompt": "x"})
    with pytest.raises(ValueError, match="inputs"):
        archer_to_riskpo({"prompt": "x", "ground_truth": json.dumps({"cases": []})})
