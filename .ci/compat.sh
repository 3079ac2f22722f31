#!/usr/bin/env bash
# Compatibility CI: this project's tests against the ends of the supported TRL x transformers range, each in a cached
# venv, and a report on TRL's newest release on the package index.
#
#   bash .ci/compat.sh [lowest] [newest] [latest]      # no argument: all three
#
#   lowest   the lowest supported TRL with the lowest supported transformers, and every other runtime dependency
#            (accelerate, datasets, peft, math-verify) at its lower bound in pyproject.toml
#   newest   the newest supported TRL with the newest supported transformers
#   latest   TRL's and transformers' newest releases on the index, together: reports whether the tests pass there
#            ("widen the range"), and never fails this script (a release can appear after the last commit)
#
# Time on 2 shared cores (load 6): about 12 minutes with the venvs cached (6 per end); building both venvs adds 5-9
# minutes (2.5-4.5 each with pip's download cache warm), and the newest-release check builds a third only when TRL
# or transformers has a release newer than the newest supported.
#
# Each end runs the fast suite and the tests that train the tiny model (SLOW_TESTS below). The ends are read from
# riskpo_trl/compat/__init__.py (TESTED), the same numbers as pyproject.toml's pins (tests/test_compat.py checks that).
# The venvs live outside the checkout, in a cache directory (RISKPO_COMPAT_CACHE overrides it), one per set of
# versions, so clean clones reuse them. The package is not installed there: the tests import this checkout through
# PYTHONPATH, so a venv never holds a stale copy of the code.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

CACHE="${RISKPO_COMPAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/riskpo-trl/compat}"
BUILD_STEPS=1  # bump when the build steps below change, so cached venvs are rebuilt
TORCH="torch==2.13.0"  # the CPU build, as .ci/run installs it
PYTHON=${RISKPO_CI_PYTHON:-python3}  # builds the venvs, as .ci/run's base interpreter
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The tests that train the tiny model end to end through the code paths that differ between versions: the trainer
# and its loss scaling (checked against verl's gradient), the train script, resume, the image-text model, the pass@k
# callback, async reward functions.
SLOW_TESTS=(tests/test_trainer.py tests/test_train_script.py tests/test_rerun.py tests/test_token_mean_groups.py
            tests/test_multimodal.py tests/test_eval_callback.py tests/test_unscored_rewards.py)
FAST_SELECTION="not slow and not distributed and not vllm_real"

# The ends, without importing the package (that needs torch): TESTED in riskpo_trl/compat/__init__.py.
read_tested() {
    "$PYTHON" - "$1" "$2" <<'EOF'
import ast, sys
tree = ast.parse(open("riskpo_trl/compat/__init__.py").read())
tested = next(ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "TESTED"
              or isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TESTED")
print(tested[sys.argv[1]][0 if sys.argv[2] == "lowest" else 1])
EOF
}

# The other runtime dependencies, as pyproject.toml lists them (TRL and transformers are pinned per venv), and each
# at its lower bound, which the lowest end installs.
mapfile -t OTHER_DEPS < <("$PYTHON" -c '
import re, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print(*[d for d in deps if re.split(r"[<>=!~ ;\[]", d)[0] not in ("torch", "trl", "transformers")], sep="\n")')
mapfile -t LOWEST_OTHER_DEPS < <("$PYTHON" -c '
import re, sys
for dep in sys.argv[1:]:
    name, low = re.split(r"[<>=!~ ;\[]", dep)[0], re.search(r">=\s*([^,;\s]+)", dep)
    if low is None:
        sys.exit(f"pyproject.toml: {dep!r} has no lower bound for the lowest end to install")
    print(f"{name}=={low.group(1)}")' "${OTHER_DEPS[@]}")
# What the selected tests import besides the package: pytest, and the notebook and plot tools of the dev extra.
TEST_TOOLS=("pytest>=8" "pytest-timeout>=2.3" "nbclient>=0.10" "nbformat>=5.10" "ipykernel>=6" "matplotlib>=3.8")

# venv_for REQUIREMENT...: prints the path of a venv holding exactly these requirements, building it if needed.
venv_for() {
    local key venv log
    key=$( { echo "$BUILD_STEPS"; "$PYTHON" --version; printf '%s\n' "$TORCH" "$@" "${OTHER_DEPS[@]}" "${TEST_TOOLS[@]}"; } \
        | sha256sum | cut -c1-16)
    venv="$CACHE/venv-$key"
    if [[ -f "$venv/.complete" ]]; then
        echo "$venv"
        return
    fi
    log="$venv.build.log"
    echo "Building a venv for $* in $venv (2-4 minutes; log: $log)" >&2
    rm -rf "$venv"
    mkdir -p "$CACHE"
    "$PYTHON" -m venv "$venv"
    # torch first and alone, so no dependency pulls the multi-GB CUDA wheels.
    if ! { "$venv/bin/pip" install "$TORCH" && "$venv/bin/pip" install "$@" "${OTHER_DEPS[@]}" "${TEST_TOOLS[@]}"; } \
        > "$log" 2>&1; then
        grep -v '^WARNING: Location' "$log" | tail -30 >&2
        echo "pip could not build the venv for $* (full log: $log)" >&2
        return 1
    fi
    touch "$venv/.complete"
    echo "$venv"
}

versions_in() {
    "$1/bin/python" -c 'import importlib.metadata as m; print(*(f"{p} {m.version(p)}" for p in ("trl", "transformers", "accelerate", "peft", "datasets", "math-verify")), sep=", ")'
}

# run_suites VENV LABEL: the fast suite, then the slow training tests; prints one summary line, returns their status.
run_suites() {
    local venv=$1 label=$2 fast=0 slow=0 start=$SECONDS
    echo "== $label: $(versions_in "$venv")"
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        -m "$FAST_SELECTION" --ignore-glob='tests/test_vllm_real_*' || fast=$?
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$venv/bin/python" -m pytest -q -p no:cacheprovider \
        -m "slow and not distributed" "${SLOW_TESTS[@]}" || slow=$?
    echo "== $label: fast suite exit $fast, slow training tests exit $slow ($(( SECONDS - start )) s)"
    (( fast == 0 && slow == 0 ))
}

check_end() {
    local end=$1 trl tf venv pins
    trl=$(read_tested trl "$end")
    tf=$(read_tested transformers "$end")
    pins=("trl==$trl" "transformers==$tf")
    # the lowest end holds every other runtime dependency at its lower bound too; the newest takes their newest
    if [[ "$end" == lowest ]]; then pins+=("${LOWEST_OTHER_DEPS[@]}"); fi
    venv=$(venv_for "${pins[@]}")
    run_suites "$venv" "$end supported end (trl $trl, transformers $tf)"
}

# The newest release of a package on the index ("" when the index cannot be read).
index_latest() {
    "$PYTHON" -m pip index versions "$1" 2>/dev/null | sed -n "s/^$1 (\(.*\))\$/\1/p"
}

# TRL's and transformers' newest releases on the index, together.
check_latest() {
    local trl tf newest_trl newest_tf venv
    newest_trl=$(read_tested trl newest)
    newest_tf=$(read_tested transformers newest)
    trl=$(index_latest trl)
    tf=$(index_latest transformers)
    if [[ -z "$trl" || -z "$tf" ]]; then
        echo "LATEST: could not read TRL's or transformers' releases from the package index; not checked (not a failure)"
        return 0
    fi
    if [[ "$trl" == "$newest_trl" && "$tf" == "$newest_tf" ]]; then
        echo "LATEST: trl $trl and transformers $tf, the newest supported and tested releases: nothing more to check"
        return 0
    fi
    if ! venv=$(venv_for "trl==$trl" "transformers==$tf"); then
        echo "LATEST: trl $trl with transformers $tf could not be installed next to torch 2.13.0; not checked (not a failure)"
        return 0
    fi
    # The package refuses versions outside the tested range at import; this run is what tells whether it may widen.
    if RISKPO_ALLOW_UNTESTED_VERSIONS=1 run_suites "$venv" "latest trl $trl, transformers $tf"; then
        echo "LATEST: trl $trl, transformers $tf (with $(versions_in "$venv")) pass the tests; widen the range: pins, TESTED in riskpo_trl/compat/__init__.py, the table in docs/installation.md (not a failure)"
    else
        echo "LATEST: trl $trl, transformers $tf (with $(versions_in "$venv")) FAIL tests above; the supported range stays at trl<=$newest_trl, transformers<=$newest_tf (not a failure)"
    fi
}

targets=("$@")
(( ${#targets[@]} )) || targets=(lowest newest latest)
status=0
start=$SECONDS
for target in "${targets[@]}"; do
    case "$target" in
        lowest|newest) check_end "$target" || status=1 ;;
        latest) check_latest ;;
        *) echo "unknown target $target: use lowest, newest or latest" >&2; exit 2 ;;
    esac
done
echo "compat summary: ${targets[*]}: exit $status ($(( SECONDS - start )) s)"
exit "$status"
