"""The studies' structure: one-way imports, one ``Job``, one runner, one command-line shape, no import side effects.

Read from the source (imports inside functions included), so a cycle hidden in a lazy import fails here too."""

import ast
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmarks.pipeline import Job, run_jobs

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
# The study protocols: each runs on benchmarks.pipeline and parses its command line with study_parser.
PROTOCOLS = (
    "benchmarks.lm_study.short_protocol",
    "benchmarks.lm_study.long_protocol",
    "benchmarks.lm_study.exact_protocol",
    "benchmarks.lm_study.baseline_protocol",
    "benchmarks.lm_study.frontier_protocol",
    "benchmarks.tabular_study",
    "benchmarks.tabular_baseline",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parsed() -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(p): (p, ast.parse(p.read_text(), str(p))) for p in sorted(BENCHMARKS.rglob("*.py"))}


def imported_modules(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The benchmarks modules ``name`` imports anywhere in its source (``from .x import y`` counts ``.x.y`` when
    that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = parsed()
    known = set(modules)
    return {name: imported_modules(name, path, tree, known) for name, (path, tree) in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = import_graph()
    planted = {
        **graph,
        "benchmarks.pipeline": graph["benchmarks.pipeline"] | {"benchmarks.lm_study.frontier_protocol"},
    }
    cycle = find_cycle(planted)
    assert cycle and cycle[0] == cycle[-1] and "benchmarks.pipeline" in cycle


def test_the_walk_sees_imports_inside_functions():
    graph = import_graph()
    tree = ast.parse("def f():\n    from .exact_report import report\n")
    found = imported_modules(
        "benchmarks.lm_study.exact_protocol", BENCHMARKS / "lm_study" / "exact_protocol.py", tree, set(graph)
    )
    assert found == {"benchmarks.lm_study.exact_report"}


def test_benchmarks_imports_have_no_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in benchmarks/: " + " -> ".join(cycle)


def test_one_job_class_and_one_runner():
    jobs, runners = [], []
    for name, (_, tree) in parsed().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Job"):
                jobs.append(f"{name}.{node.name}")
        imports = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
        }
        if "multiprocessing" in imports:
            runners.append(name)
    assert jobs == ["benchmarks.pipeline.Job"]
    assert runners == ["benchmarks.pipeline"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_protocol_uses_the_pipeline_and_the_shared_command_line(protocol):
    path, tree = parsed()[protocol]
    calls = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert {"study_parser", "parse_study_args", "run_jobs"} <= calls, path
    assert "ArgumentParser" not in path.read_text(), path


def test_importing_the_studies_changes_no_environment_and_loads_no_trainer_library():
    """Setting the environment is the entry points' job (benchmarks.pipeline.parse_study_args); an import must not
    change it, nor pull in datasets, transformers or TRL."""
    code = (
        "import os, sys; before = dict(os.environ)\n"
        + "".join(f"import {m}\n" for m in PROTOCOLS)
        + "changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'datasets', 'transformers', 'trl'})\n"
        "print(changed, heavy)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "WANDB_DISABLED", "TOKENIZERS_PARALLELISM")
    }
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def test_no_private_trainer_state_is_written():
    """The study records its probes on its own trainer attributes, never in TRL's private ``_metrics``/``_logs``."""
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path, tree in parsed().values()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("_metrics", "_logs")
    ]
    assert offenders == []


def record_and_write(path: Path, value: str, attempts: Path) -> None:
    """A run for the runner tests: notes the attempt, then fails (``value == "fail"``) or writes its file."""
    with open(attempts, "a") as f:
        f.write(path.stem + "\n")
    if value == "fail":
        raise RuntimeError("planted failure")
    path.write_text(json.dumps(value))


def planted_plan(folder: Path) -> list[Job]:
    """a, b (fails), and c, which is named only once a has finished (as a grid names later runs)."""
    attempts = folder / "attempts.txt"
    job = {
        n: Job(n, folder / f"{n}.json", record_and_write, (folder / f"{n}.json", v, attempts))
        for n, v in [("a", "A"), ("b", "fail"), ("c", "C")]
    }
    return [job["a"], job["b"], *([job["c"]] if (folder / "a.json").exists() else [])]


def bounded(plan: Callable[[], list[Job]], limit: int = 50) -> Callable[[], list[Job]]:
    """``plan``, failing once asked ``limit`` times: a runner that forgets a failed run runs it again and again in one
    pass, so its test fails here rather than hanging."""
    calls = itertools.count(1)

    def again() -> list[Job]:
        if next(calls) > limit:
            raise AssertionError(f"the runner asked for its plan {limit} times in one pass: it forgot a failed run")
        return plan()

    return again


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # 2: fresh processes (minutes)
def test_runner_runs_in_plan_order_rereads_the_plan_reports_a_failure_once_and_resumes(tmp_path, workers):
    log = run_jobs(bounded(lambda: planted_plan(tmp_path)), workers, "test")
    attempts = (tmp_path / "attempts.txt").read_text().split()
    assert sorted(attempts) == ["a", "b", "c"]  # b failed and was not retried in this pass
    if workers == 0:
        assert attempts == ["a", "b", "c"] and [line.split(":")[0] for line in log] == ["a", "b", "c"]
    assert any(line.startswith("b: FAILED RuntimeError: planted failure") for line in log)
    assert json.loads((tmp_path / "c.json").read_text()) == "C"

    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")}
    again = run_jobs(bounded(lambda: planted_plan(tmp_path)), workers, "test")
    assert [line.split(":")[0] for line in again] == ["b"]  # the cached runs are skipped; the failed one retried
    assert {p: p.stat().st_mtime_ns for p in tmp_path.glob("*.json")} == stamps


def test_a_runner_that_forgets_a_failed_run_fails_the_runner_test(tmp_path, monkeypatch):
    """Mutation: the pipeline without its set of failed runs (in a copy) reruns the failing run without end; the
    bounded plan turns that into a failure."""
    import importlib.util

    source = (BENCHMARKS / "pipeline.py").read_text()
    assert source.count("failed.add(job.path)") == 1
    mutant_path = tmp_path / "forgetful_pipeline.py"
    mutant_path.write_text(source.replace("failed.add(job.path)", "pass  # forgets the failure"))
    spec = importlib.util.spec_from_file_location("forgetful_pipeline", mutant_path)
    mutant = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mutant)  # its dataclass looks its module up
    spec.loader.exec_module(mutant)
    runs = tmp_path / "runs"
    runs.mkdir()
    with pytest.raises(AssertionError, match="it forgot a failed run"):
        mutant.run_jobs(bounded(lambda: planted_plan(runs)), 0, "test")
    assert run_jobs(bounded(lambda: planted_plan(runs)), 0, "test")  # the real runner, on the same plan, ends


def kill_own_process(path: Path) -> None:
    """A run whose process dies outright, as under the kernel's out-of-memory killer."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_run_whose_process_dies_is_reported_and_the_runner_goes_on(tmp_path):
    """The broken pool is replaced by a fresh one (three fresh processes: about 20 s on a loaded 2-core machine)."""
    import threading

    dies = Job("dies", tmp_path / "dies.json", kill_own_process, (tmp_path / "dies.json",))
    attempts = tmp_path / "attempts.txt"
    rest = [Job(n, tmp_path / f"{n}.json", record_and_write, (tmp_path / f"{n}.json", n, attempts)) for n in "ab"]
    result: list[list[str]] = []
    runner = threading.Thread(target=lambda: result.append(run_jobs(lambda: [dies, *rest], 1, "test")), daemon=True)
    runner.start()
    runner.join(timeout=300)
    assert not runner.is_alive(), "the runner waits on a dead process"
    (log,) = result
    assert log[0].startswith("dies: FAILED its process died")
    assert [line.split(":")[0] for line in log] == ["dies", "a", "b"]
    assert [json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"] == ["a", "b"]
