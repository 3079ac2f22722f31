"""The code sandbox and reward: honest programs pass, grading is decided in the trainer, limits hold, and the sandbox
starts and refuses as documented. Attacks on the machine are in test_sandbox_attacks.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import processes_with

from riskpo_trl.code import bounded_json, cgroups
from riskpo_trl.code.assertions import assertions_pass, instrument_assertions
from riskpo_trl.code.executor import Executor
from riskpo_trl.code.judge import JudgeLimits, Verdict, judge
from riskpo_trl.code.reward import CodeReward, code_reward_from_settings, extract_code
from riskpo_trl.code.sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxUnavailableError,
    detect_isolation,
    fallback_statement,
    remove_tree,
)
from riskpo_trl.code.testspec import TestSpec
from riskpo_trl.code.values import values_equal

FAST = SandboxLimits(
    test_timeout_s=1.0, total_timeout_s=4.0, cpu_time_s=3, memory_mb=512, max_output_bytes=1 << 20, disk_mb=16
)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(FAST, max_workers=2)


@pytest.fixture(scope="module")
def reward(sandbox) -> CodeReward:
    return CodeReward(sandbox=sandbox)


def as_completion(program: str) -> list[dict]:
    return [{"role": "assistant", "content": f"Here it is.\n```python\n{textwrap.dedent(program)}\n```"}]


ADD_TESTS = TestSpec("stdin", ["1 2\n", "5 7\n"], ["3\n", "12"]).to_json()


# --- correct programs score 1, wrong ones 0 ------------------------------------------------------------------------


def test_correct_stdin_program_scores_one(reward):
    program = "a, b = map(int, input().split())\nprint(a + b)"
    assert reward([as_completion(program)], [ADD_TESTS]) == [1.0]


def test_reading_stdin_through_fd_zero_and_buffer(reward):
    programs = [
        "print(sum(map(int, open(0).read().split())))",
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())))",
    ]
    assert reward([as_completion(p) for p in programs], [ADD_TESTS] * 2) == [1.0, 1.0]


def test_wrong_output_or_missing_code_scores_zero(reward):
    completions = [as_completion("print(3)"), [{"role": "assistant", "content": "print(3) without a fence"}]]
    assert reward(completions, [ADD_TESTS] * 2) == [0.0, 0.0]


def test_functional_tests_call_solution_method_and_function(reward):
    spec = TestSpec("functional", ["[1, 2, 3]\n2", "[]\n0"], ["[2, 4, 6]", "[]"], fn_name="scale").to_json()
    method = "class Solution:\n    def scale(self, nums: List[int], k: int) -> List[int]:\n        return [x * k for x in nums]"
    function = "def scale(nums, k):\n    return tuple(x * k for x in nums)"  # tuples compare as JSON lists
    wrong = "def scale(nums, k):\n    return nums"
    assert reward([as_completion(p) for p in (method, function, wrong)], [spec] * 3) == [1.0, 1.0, 0.0]


def test_assert_style_tests_need_the_check_to_complete(reward):
    spec = TestSpec("assert", ["assert Solution().double(4) == 8\nassert Solution().double(0) == 0"], [""]).to_json()
    good = "class Solution:\n    def double(self, x):\n        return 2 * x"
    exits_early = "import sys\nsys.exit(0)"  # exits before the check runs: must not count as a pass
    exits_early_hard = "import os\nos._exit(0)"
    assert reward([as_completion(p) for p in (good, exits_early, exits_early_hard)], [spec] * 3) == [1.0, 0.0, 0.0]


ADD_ONE_CHECK = TestSpec(
    "assert",
    ["def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n\ncheck(Solution().addOne)"],
    [""],
).to_json()


def test_assert_style_check_cannot_be_skipped_by_replacing_exec(reward):
    program = "import builtins\nbuiltins.exec = lambda *args, **kwargs: None\nbuiltins.compile = lambda *a, **k: None"
    assert reward([as_completion(program)], [ADD_ONE_CHECK]) == [0.0]


def test_assert_style_check_cannot_be_forged_through_the_report_fd(reward):
    program = """
    import json, os
    fake = json.dumps({"outputs": [""], "error": None}).encode() + b"\\n"
    for fd in range(3, 64):
        try:
            os.write(fd, fake)
        except OSError:
            pass
    for name in os.listdir("."):
        try:
            open(name, "ab").write(fake)
        except OSError:
            pass
    os._exit(0)
    """
    assert reward([as_completion(program)], [ADD_ONE_CHECK]) == [0.0]


def test_assert_style_check_is_not_fooled_by_a_custom_eq(reward):
    program = """
    class Anything:
        def __eq__(self, other):
            return True
        __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
        def __bool__(self):
            return True

    class Solution:
        def addOne(self, x):
            return Anything()
    """
    good = "class Solution:\n    def addOne(self, x):\n        return x + 1"
    assert reward([as_completion(program), as_completion(good)], [ADD_ONE_CHECK] * 2) == [0.0, 1.0]


def test_assert_style_check_cannot_install_tracers_or_hooks(sandbox):
    programs = ["import sys\nsys.settrace(lambda *a: None)", "import sys\nsys.setprofile(lambda *a: None)"]
    results = [sandbox.run(program, ["x = 1"], "assert") for program in programs]
    assert [r.ok for r in results[:2]] == [False, False]
    # CPython silently drops a hook that an existing hook refuses (it swallows the Exception): it must never be called
    program = "import sys\ncalls = []\nsys.addaudithook(lambda event, args: calls.append(event))\nopen('x', 'w')\nprint(len(calls))"
    assert sandbox.run(program, [""]).outputs == ["0\n"]


def test_assert_instrumentation_keeps_literal_expectations_out_of_the_sandbox():
    code = "def check(c):\n    assert c(1) == 'secret-expected' and c(2) is None, 'msg'\n    assert not c(3) < 7\ncheck(f)"
    check = instrument_assertions(code)
    assert "secret-expected" not in check.sandbox_code and "assert" not in check.sandbox_code
    assert "7" not in check.sandbox_code and "None" not in check.sandbox_code
    assert [probe.n_leaves for probe in check.probes] == [2, 1]  # c(1), c(2); c(3)
    passing = json.dumps([[0, ["secret-expected", None]], [1, [9]]])
    assert assertions_pass(passing, check)
    assert not assertions_pass(json.dumps([[0, ["guess", None]], [1, [9]]]), check)
    assert not assertions_pass(json.dumps([[0, ["secret-expected", None]]]), check)  # one skipped
    assert not assertions_pass(json.dumps([[0, ["secret-expected", None]]] * 2 + [[1, [9]]]), check)  # one repeated
    assert not assertions_pass(json.dumps([[5, [1]]]), check) and not assertions_pass("", check)


def test_honest_programs_pass_varied_assert_forms(reward):
    checks = (
        "assert f([3, 1]) == (1, 3)\nassert f([]) == []\nassert f([2])\nassert not f([])\n"
        "assert 1 in f([1, 2])\nassert len(f([5, 4])) >= 2\nassert set(f([2, 2])) == {2}\n"
        "assert abs(sum(f([0.1, 0.2])) - 0.3) < 1e-9\nassert f([1]) is not None"
    )
    spec = TestSpec("assert", [checks], [""]).to_json()
    good, wrong = "def f(xs):\n    return sorted(xs)", "def f(xs):\n    return list(xs)"
    assert reward([as_completion(good), as_completion(wrong)], [spec] * 2) == [1.0, 0.0]


# --- honest programs the red team saw fail ------------------------------------------------------------------------


def test_exit_and_quit_end_a_stdin_program(reward):
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    programs = ["print(3)\nexit()", "print(3)\nquit(0)", "print(3)\nexit(0)\nprint(4)"]
    assert reward([as_completion(p) for p in programs], [spec] * 3) == [1.0, 1.0, 1.0]


def test_counter_defaultdict_and_namedtuple_results_compare_as_their_builtin_base(reward):
    counts = TestSpec("functional", ['"aab"'], ['{"a": 2, "b": 1}'], fn_name="f").to_json()
    pair = TestSpec("functional", ['"aab"'], ["[1, 2]"], fn_name="f").to_json()
    cases = [
        ("def f(s):\n    return Counter(s)", counts, 1.0),
        ("def f(s):\n    d = defaultdict(int)\n    for c in s:\n        d[c] += 1\n    return d", counts, 1.0),
        ("Point = namedtuple('Point', 'x y')\ndef f(s):\n    return Point(1, 2)", pair, 1.0),
        ("def f(s):\n    return Counter(s + 'b')", counts, 0.0),
    ]
    assert reward([as_completion(p) for p, _, _ in cases], [spec for _, spec, _ in cases]) == [w for *_, w in cases]


def test_assert_tests_against_int_keyed_dicts_and_bytes(reward):
    spec = TestSpec("assert", ["assert f(2) == {1: 2, 2: 4}\nassert g() == b'ab'"], [""]).to_json()
    good = "def f(n):\n    return {i: 2 * i for i in range(1, n + 1)}\ndef g():\n    return b'ab'"
    wrong = "def f(n):\n    return {str(i): 2 * i for i in range(1, n + 1)}\ndef g():\n    return 'ab'"
    assert reward([as_completion(good), as_completion(wrong)], [spec] * 2) == [1.0, 0.0]


def test_assertions_in_branches_not_taken(reward):
    check = (
        "def check(candidate):\n"
        "    for x, want in [(1, 2), (3, 4)]:  # the float branch is never taken\n"
        "        if isinstance(want, float):\n"
        "            assert abs(candidate(x) - want) < 1e-9\n"
        "        else:\n"
        "            assert candidate(x) == want\n"
        "check(f)"
    )
    spec = TestSpec("assert", [check], [""]).to_json()
    good, wrong = "def f(x):\n    return x + 1", "def f(x):\n    return x"
    assert reward([as_completion(good), as_completion(wrong)], [spec] * 2) == [1.0, 0.0]


def test_multiprocessing_pool_works_within_the_limits(reward):
    program = """
    from multiprocessing import Pool

    def square(x):
        return x * x

    if __name__ == "__main__":
        pool = Pool(2)
        squares = pool.map(square, range(int(input())))
        pool.terminate()  # signals its live workers: the program's own children
        pool.join()
        print(sum(squares))
    """
    spec = TestSpec("stdin", ["10\n"], ["285"]).to_json()
    assert reward([as_completion(program)], [spec]) == [1.0]


def test_missing_or_broken_tests_are_unscorable(reward):
    broken_check = json.dumps({"style": "assert", "inputs": ["assert f(1) == ("], "outputs": [""]})
    with pytest.raises(ValueError, match="does not parse"):
        TestSpec("assert", ["assert f(1) == ("], [""])
    tests = [None, "not json", '{"style": "stdin"}', broken_check]
    assert reward([as_completion("print(1)")] * 4, tests) == [None] * 4


class StubExecutor:
    """An executor that runs nothing: passes a program iff it is in ``passing`` (a remote service would run it)."""

    max_workers = 2

    def __init__(self, passing: set[str]):
        self.passing, self.checked, self.runs = passing, 0, []

    def check(self):
        self.checked += 1

    def run(self, program: str, tests: TestSpec) -> Verdict:
        self.runs.append((program.strip(), tests.style))
        return Verdict(program.strip() in self.passing, "stub")


def test_code_reward_talks_to_any_executor():
    stub = StubExecutor({"print(3)"})
    reward = CodeReward(executor=stub)
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    scores = reward(
        [as_completion("print(3)"), as_completion("print(4)"), as_completion("print(3)")], [spec, spec, "not json"]
    )
    assert scores == [1.0, 0.0, None]
    assert stub.checked == 1 and sorted(stub.runs) == [("print(3)", "stdin"), ("print(4)", "stdin")]
    assert isinstance(CodeReward(sandbox=Sandbox(FAST)).executor, Executor)
    with pytest.raises(ValueError, match="configure your executor"):
        CodeReward(FAST, executor=stub)
    with pytest.raises(TypeError, match="max_workers, check"):
        CodeReward(executor=object())


def test_recipe_settings_set_the_judge_limits_and_refuse_unknown_judge_keys():
    reward = code_reward_from_settings(
        {"executor": "none", "max_workers": 1, "judge_timeout_s": 3, "judge_memory_mb": 512}
    )
    assert reward.executor.judge_limits == JudgeLimits(timeout_s=3, memory_mb=512)
    with pytest.raises(
        ValueError,
        match=r"unknown key\(s\) \['judge_cpu_s'\] \(did you mean judge_cpu_time_s for "
        r"judge_cpu_s\?\).*'judge_cpu_time_s'",
    ):
        code_reward_from_settings({"executor": "none", "judge_cpu_s": 3})


def test_the_judge_fails_a_completion_whose_report_it_cannot_judge_in_time():
    """The judge process, not the trainer, pays for a report built to be slow to judge, and is killed on time."""
    colliding = json.dumps([[0, [{"__set__": [k * (2**61 - 1) for k in range(1, 30001)]}]]]).encode()
    report = b"O%d\n" % len(colliding) + colliding + b"D0\n"
    spec = TestSpec("assert", ["assert f(1) == {1, 2}"], [""]).to_json()
    limits = JudgeLimits(timeout_s=1.0, cpu_time_s=1, memory_mb=512)
    start, cpu = time.monotonic(), time.process_time()
    verdict = judge(spec, report, limits)
    assert not verdict.passed and "no verdict" in verdict.reason
    assert time.monotonic() - start < limits.timeout_s + 5 and time.process_time() - cpu < 1.0
    honest = json.dumps([[0, [{"__set__": [1, 2]}]]]).encode()
    assert judge(spec, b"O%d\n" % len(honest) + honest + b"D0\n", limits) == Verdict(True)


def test_extract_code_takes_last_python_block_after_thinking():
    text = "<think>```python\nprint('draft')\n```</think>Answer:\n```python\nprint(1)\n```\n```py\nprint(2)\n```"
    assert extract_code(text) == "print(2)\n"
    assert extract_code("no fence here") is None


# --- hostile programs ------------------------------------------------------------------------------------------


def test_infinite_loop_is_stopped_by_the_timeout(reward):
    start = time.monotonic()
    assert reward([as_completion("while True:\n    pass")], [ADD_TESTS]) == [0.0]
    assert time.monotonic() - start < FAST.total_timeout_s + 2


def test_loop_that_swallows_the_timer_is_killed_by_the_wall_clock(reward):
    program = """
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
    """
    start = time.monotonic()
    assert reward([as_completion(program)], [ADD_TESTS]) == [0.0]
    assert time.monotonic() - start < FAST.total_timeout_s + 2


def test_fork_loop_is_capped_at_max_processes(sandbox):
    """fork is allowed (multiprocessing), within max_processes: the pids cgroup, or RLIMIT_NPROC without one."""
    program = """
    import os, time
    made = 0
    for _ in range(40):
        try:
            if os.fork() == 0:
                time.sleep(1)
                os._exit(0)
            made += 1
        except OSError:
            break
    print(made)
    """
    result = sandbox.run(textwrap.dedent(program), [""])
    assert result.ok and 1 <= int(result.outputs[0]) <= FAST.max_processes


def test_memory_hog_fails_without_hurting_the_parent(reward):
    hogs = ["x = bytearray(8 * 1024 ** 3)\nprint(3)", "chunks = []\nwhile True:\n    chunks.append(b'x' * 10 ** 7)"]
    assert reward([as_completion(p) for p in hogs], [ADD_TESTS] * 2) == [0.0, 0.0]


def test_a_deeply_nested_tests_cell_makes_only_its_row_unscorable(reward):
    """Cells nested 200,000 deep (plain json.loads raises RecursionError) score None; the honest row still scores."""
    deep = "[" * 200_000 + "]" * 200_000
    cells = [ADD_TESTS, deep, '{"style": "stdin", "inputs": ' + deep + ', "outputs": ["3"]}', '{"a": ' * 200_000]
    program = as_completion("a, b = map(int, input().split())\nprint(a + b)")
    assert reward([program] * len(cells), cells) == [1.0, None, None, None]


def test_output_flood_is_bounded(reward):
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"
    assert reward([as_completion(program)], [ADD_TESTS]) == [0.0]


def test_writing_inside_the_working_directory_is_allowed(reward):
    program = "open('scratch.txt', 'w').write('3')\nprint(open('scratch.txt').read())"
    assert reward([as_completion(program)], [TestSpec("stdin", ["1 2"], ["3"]).to_json()]) == [1.0]


def test_parallel_batch_with_hostile_programs_finishes_in_time(reward):
    programs = ["a, b = map(int, input().split())\nprint(a + b)", "while True:\n    pass", "print(3)"] * 2
    start = time.monotonic()
    scores = reward([as_completion(p) for p in programs], [ADD_TESTS] * len(programs))
    assert scores == [1.0, 0.0, 0.0] * 2
    # two workers, two timed-out programs: about one total timeout each, in parallel
    assert time.monotonic() - start < 2 * FAST.total_timeout_s + 3


# --- workers, isolation, the probe and cleanup ----------------------------------------------------------------


def test_default_workers_share_the_cores_among_local_training_processes(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert Sandbox().max_workers == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert Sandbox().max_workers == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert Sandbox().max_workers == 16


def test_honest_programs_use_tempfile_mkdir_rename_and_remove_in_their_directory():
    program = textwrap.dedent("""
        import os, shutil, tempfile
        fd, path = tempfile.mkstemp()
        os.write(fd, b"1")
        os.close(fd)
        with tempfile.TemporaryDirectory() as scratch:
            os.mkdir(os.path.join(scratch, "sub"))
            os.rename(path, os.path.join(scratch, "sub", "moved"))
            os.symlink("moved", os.path.join(scratch, "sub", "link"))
            total = int(open(os.path.join(scratch, "sub", "link")).read()) + 2
            os.remove(os.path.join(scratch, "sub", "link"))
            os.remove(os.path.join(scratch, "sub", "moved"))
            os.rmdir(os.path.join(scratch, "sub"))
        os.makedirs("a/b/c")
        open("a/b/c/x", "w").write("x")
        shutil.rmtree("a")
        assert os.path.expanduser("~") == os.getcwd() == tempfile.gettempdir()
        print(total)
        """)
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    for guard in (True, False):
        reward = CodeReward(sandbox=Sandbox(FAST, max_workers=1, audit_guard=guard))
        assert reward([as_completion(program)], [spec]) == [1.0], f"audit_guard={guard}"


def test_the_program_sees_a_minimal_unprivileged_machine():
    """What a program observes inside the sandbox, and its uid as the host sees it."""
    from riskpo_trl.code.bwrap import interpreter_mounts

    token = f"riskpo-view-{os.getpid()}-{time.monotonic_ns()}"
    program = textwrap.dedent(f"""
        import importlib.util, json, os, socket, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)", {token!r}])
        view = {{
            "uid": os.getuid(), "groups": os.getgroups(), "root": sorted(os.listdir("/")),
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "hostname": socket.gethostname(),  # the interfaces from /proc: seccomp refuses every socket
            "interfaces": [line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]],
            "caps": [line.split()[1] for line in open("/proc/self/status") if line.startswith("Cap")],
            "env": sorted(os.environ), "site_packages_hidden": importlib.util.find_spec("pytest") is None,
            "root_writable": os.access("/", os.W_OK), "cwd": os.getcwd(),
        }}
        child.wait()
        print(json.dumps(view))
        """)
    sandbox = Sandbox(
        dataclasses.replace(FAST, test_timeout_s=4.0, total_timeout_s=6.0), max_workers=1, audit_guard=False
    )
    sandbox.check()
    host_uids = []
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(sandbox.run, program, [""])
        deadline = time.monotonic() + 4
        while not host_uids and time.monotonic() < deadline:
            host_uids = [os.stat(f"/proc/{pid}").st_uid for pid in processes_with(token)]
            time.sleep(0.05)
        result = future.result()
    assert result.ok, result.error
    view = json.loads(result.outputs[0])
    binds, links, hidden = interpreter_mounts()
    allowed_top = (
        {"sandbox", "dev", "proc"}
        | {path.split("/")[1] for path in [*binds, *hidden]}
        | {link.split("/")[1] for _, link in links}
    )
    assert set(view["root"]) <= allowed_top, view["root"]
    assert view["uid"] != 0 and view["groups"] in ([], [view["uid"]])
    assert len(view["pids"]) <= 4  # bwrap's init, the runner, the child: no host process is visible
    assert view["hostname"] == "sandbox" and view["interfaces"] == ["lo"]
    assert set(view["caps"]) == {"0000000000000000"}
    assert set(view["env"]) <= {"HOME", "TMPDIR", "PATH", "LANG", "PYTHONIOENCODING", "PWD"}  # PWD: bwrap sets it
    assert view["site_packages_hidden"] and not view["root_writable"] and view["cwd"] == "/sandbox"
    assert host_uids, "the sandboxed child was not seen from the host"
    assert all(uid != 0 for uid in host_uids) if os.geteuid() == 0 else all(uid == os.geteuid() for uid in host_uids)


@pytest.fixture
def fresh_probe():
    detect_isolation.cache_clear()
    yield
    detect_isolation.cache_clear()


def test_missing_bubblewrap_is_refused_naming_the_package(fresh_probe, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match="bubblewrap"):
        Sandbox(FAST).check()
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        CodeReward(FAST)([as_completion("print(3)")], [TestSpec("stdin", [""], ["3"]).to_json()])


def test_bubblewrap_that_cannot_create_namespaces_is_refused_naming_the_kernel_settings(
    fresh_probe, monkeypatch, tmp_path
):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SandboxUnavailableError) as raised:
        code_reward_from_settings({"max_workers": 1})
    message = str(raised.value)
    assert "user.max_user_namespaces" in message and "apparmor_restrict_unprivileged_userns" in message


def test_the_unisolated_executor_is_explicit_and_warned_about_on_every_batch(caplog):
    reward = code_reward_from_settings({"executor": "none", "max_workers": 1, "total_timeout_s": 5})
    assert reward.sandbox.isolation.mode == "none"
    spec = TestSpec("stdin", [""], ["3"]).to_json()
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.code.sandbox"):
        caplog.clear()
        assert reward([as_completion("print(3)")], [spec]) == [1.0]
        assert reward([as_completion("print(3)")], [spec]) == [1.0]
    assert sum("isolation='none'" in record.getMessage() for record in caplog.records) == 2  # one per batch
    with pytest.raises(ValueError, match="isolation='nsjail' is unknown"):
        Sandbox(isolation="nsjail")


def test_cleanup_of_a_deep_tree_neither_recurses_nor_raises(tmp_path, caplog):
    """isolation='none' deletes the program's directory from the host; a 1,500-deep tree broke shutil.rmtree."""
    top = tmp_path / "workdir"
    fd = os.open(tmp_path, os.O_RDONLY)
    os.mkdir("workdir", dir_fd=fd)
    current = os.open("workdir", os.O_RDONLY, dir_fd=fd)
    for depth in range(1500):
        os.mkdir("d", dir_fd=current)
        open(f"/proc/self/fd/{current}/f{depth % 3}", "w").close()
        nxt = os.open("d", os.O_RDONLY, dir_fd=current)
        os.close(current)
        current = nxt
    os.chmod(f"/proc/self/fd/{current}", 0)  # an unreadable leaf directory
    os.close(current)
    os.close(fd)
    remove_tree(str(top))
    assert not top.exists()
    remove_tree(str(tmp_path / "missing"))  # logs, does not raise
    assert "Could not" in caplog.text


def test_isolation_none_cleans_up_a_deep_tree_the_program_leaves():
    # without the audit hook, whose realpath per call makes 1,500 nested mkdirs quadratic (seconds)
    limits = dataclasses.replace(FAST, test_timeout_s=5.0, total_timeout_s=8.0)
    reward = CodeReward(sandbox=Sandbox(limits, max_workers=1, isolation="none", audit_guard=False))
    program = "import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint(os.getcwd().count('/d'))"
    assert reward([as_completion(program)], [TestSpec("stdin", [""], ["1500"]).to_json()]) == [1.0]


def test_bounded_json_refuses_deep_oversized_or_bulky_text():
    assert bounded_json.loads('{"a": ["[[[", 1]}', max_bytes=100) == {"a": ["[[[", 1]}
    assert bounded_json.nesting_depth('["\\"[[", [[1]]]') == 3
    for text, limit in (("[" * 100_000, 10**6), ("[" * 101 + "]" * 101, 10**6), ("[1]" * 10, 5)):
        with pytest.raises(ValueError):
            bounded_json.loads(text, max_bytes=limit)
    with pytest.raises(ValueError, match="deeper"):
        bounded_json.loads('["' + "x" * 5_000_000 + '"' + "[" * 200, max_bytes=10**8)
    assert bounded_json.loads('["' + "[" * 1000 + '"]', max_bytes=10**4) == ["[" * 1000]
    assert bounded_json.loads("[" + "[]," * 1000 + "[]]", max_bytes=10**8) == [[]] * 1001  # wide, not deep
    assert bounded_json.nesting_depth('["a\\\\", ["\\"["], {"b": "\\\\\\""}]') == 2  # escaped \ and \"


def test_values_equal_handles_huge_and_non_finite_numbers():
    assert values_equal(10**400, 10**400) and not values_equal(10**400, 10**400 + 1)
    assert not values_equal(10**400, 1.5) and not values_equal(-(10**400), float("-inf"))
    assert values_equal(float("nan"), float("nan")) and not values_equal(float("nan"), 1.0)
    assert values_equal(float("inf"), float("inf")) and not values_equal(float("inf"), 1e308)
    assert values_equal(1, 1.0000001) and values_equal([1, {"a": 2.0}], [1.0, {"a": 2}])


@pytest.mark.slow
def test_sandbox_overhead_benchmark_runs_tiny(tmp_path):
    from benchmarks import sandbox_overhead

    payload = sandbox_overhead.main(["--runs", "2", "--warmup", "0", "--syscalls", "1000", "--out", str(tmp_path)])
    for program in ("trivial", "syscalls"):
        assert {"bwrap", "bwrap_no_seccomp", "none"} <= set(payload["median_ms"][program])
        # the previous sandbox is measured from git history, unless this clone lacks it (recorded, not hidden)
        assert "previous" in payload["median_ms"][program] or "unavailable" in payload["baseline"]
    assert (tmp_path / "sandbox_overhead.md").exists() and payload["load_average_before"]


def test_sandbox_throughput_benchmark_runs_tiny(tmp_path):
    from benchmarks import sandbox_throughput

    payload = sandbox_throughput.main(
        ["--rounds", "1", "--completions", "4", "--tests", "2", "--workers", "2", "--out", str(tmp_path)]
    )
    assert set(payload["median_programs_per_s"]) == {"bwrap", "none", "bwrap_in_process", "none_in_process"}
    assert payload["bwrap_over_none_ratio_of_medians"] > 0 and payload["load_average_before"]
    assert (tmp_path / "sandbox_throughput.md").exists()


def test_sandbox_steps_benchmark_runs_tiny_and_restores_what_it_timed(tmp_path):
    from benchmarks import sandbox_steps
    from riskpo_trl.code import cgroups as cgroups_module

    add = cgroups_module.RunCgroup.add
    payload = sandbox_steps.main(["--runs", "2", "--tests", "2", "--out", str(tmp_path)])
    assert set(payload["median_wall_ms"]) == {"none", "bwrap"}
    assert "the run: namespaces, interpreter, tests" in payload["bwrap_step_median_wall_ms"]
    assert all(value > 0 for value in payload["median_cpu_ms"].values())
    assert cgroups_module.RunCgroup.add is add  # the timing wrappers are gone once it returns
    assert (tmp_path / "sandbox_steps.md").exists()


# --- whole-program caps: which cgroups, and what without them ---------------------------------------------------


def _fake_cgroup_host(tmp_path, mounts: list[str], own: str):
    (tmp_path / "mountinfo").write_text("".join(f"{index} 1 0:{index} {line}\n" for index, line in enumerate(mounts)))
    (tmp_path / "cgroup").write_text(own)
    return str(tmp_path / "mountinfo"), str(tmp_path / "cgroup")


def test_start_up_states_what_holds_without_cgroups(fresh_probe, monkeypatch, caplog):
    from riskpo_trl.code import sandbox as sandbox_module

    missing = cgroups.CgroupSupport(missing={"memory": "not root", "pids": "not root"})
    monkeypatch.setattr(sandbox_module, "program_cgroups", lambda: missing)
    with caplog.at_level(logging.WARNING, logger="riskpo_trl.code.sandbox"):
        isolation = Sandbox(FAST, max_workers=1).check()
    assert "no cgroup for memory: not root; pids: not root" in isolation.describe()
    assert "memory_mb bounds each process (RLIMIT_AS), not the program" in caplog.text
    assert "max_processes is enforced per sandbox uid by RLIMIT_NPROC only" in caplog.text
    result = Sandbox(FAST, max_workers=1, isolation=isolation).run("print(3)", [""])  # runs on rlimits alone
    assert result.ok and result.outputs == ["3\n"]


def test_cgroup_v2_caps_come_from_a_delegating_parent(tmp_path):
    """v2 (most hosts): the per-run cgroups go next to the trainer's cgroup when its parent delegates memory and pids
    (v2 forbids controllers in a cgroup that holds processes); each run gets memory.max, no swap, pids.max and, where
    cpu is delegated too, cpu.max."""
    root = tmp_path / "unified"
    (root / "trainer").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    paths = _fake_cgroup_host(tmp_path, [f"/ {root} rw - cgroup2 cgroup2 rw"], "0::/trainer\n")
    support = cgroups.detect(*paths)
    assert support.bounds_memory and support.bounds_processes and support.bounds_cpu and not support.missing
    assert "cpu (cgroup v2), memory (cgroup v2), pids (cgroup v2)" in support.describe()
    assert fallback_statement(support) is None
    parent = root / cgroups.parent_name()
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    run = support.create(64 << 20, 10)
    names = ("memory.max", "memory.swap.max", "pids.max", "cpu.max")
    assert len(run.paths) == 1 and os.path.dirname(run.paths[0]) == str(parent)
    limits = {name: (Path(run.paths[0]) / name).read_text() for name in names}
    assert limits == {
        "memory.max": str(64 << 20),
        "memory.swap.max": "0",
        "pids.max": "10",
        "cpu.max": "100000 100000",
    }
    run.add(4242)
    assert (Path(run.paths[0]) / "cgroup.procs").read_text() == "4242"


def test_cgroup_v1_caps_and_the_honest_fallback_without_them(tmp_path):
    memory = tmp_path / "memory"
    (memory / "job").mkdir(parents=True)
    mounts = [f"/ {memory} rw - cgroup cgroup rw,memory", f"/ {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw"]
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")  # v2 mounted, its controllers bound to v1
    (tmp_path / "unified" / "cgroup.subtree_control").write_text("\n")
    support = cgroups.detect(*_fake_cgroup_host(tmp_path, mounts, "4:memory:/job\n0::/\n"))
    assert support.bounds_memory and not support.bounds_processes
    assert (memory / "job" / cgroups.parent_name()).is_dir()
    assert "no cgroup v1 pids hierarchy" in support.missing["pids"]
    assert "RLIMIT_NPROC" in fallback_statement(support)
    run = support.create(32 << 20, 4)
    assert os.path.dirname(run.paths[0]) == str(memory / "job" / cgroups.parent_name())
    assert (Path(run.paths[0]) / "memory.limit_in_bytes").read_text() == str(32 << 20)
    nothing = cgroups.detect(*_fake_cgroup_host(tmp_path, [], "0::/user.slice/session\n"))
    assert not nothing.hierarchies and "no cgroup v2 hierarchy is mounted" in nothing.missing["memory"]
    assert "memory_mb bounds each process (RLIMIT_AS), not the program" in fallback_statement(nothing)
