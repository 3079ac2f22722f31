"""The wheels a lent GPU machine needs to run ``benchmarks.gpu_check``, built here; installed there without a network.

    python -m benchmarks.gpu_wheels build --out .whl        # here, where PyPI is reachable
    python -m benchmarks.gpu_wheels install --wheels .whl   # on the GPU machine (standard library only)

The machine's image already holds torch with CUDA, transformers, accelerate, peft and most of their dependencies
(`DEVICE_PACKAGES`, the image's package list as read on 2026-11-17), but not TRL, datasets or math-verify. ``build``
downloads Python 3.12 wheels for those, for each of their dependencies the image lacks, and for this package, walking
the requirements of every wheel it fetched. A package the image has is carried as well when a requirement bounds its
version and it is a small pure-Python wheel: pip then falls back to it where the image's release does not fit (fsspec,
which datasets caps, is the case that matters). datasets comes in two releases with different bounds on pyarrow, dill,
multiprocess and fsspec, so pip can take whichever fits the image. The folder must travel with the working tree, so
``build`` refuses a folder over 64 MiB or over what the working tree leaves of the 64 MiB that one call may carry.

DeepSpeed comes as a wheel that ``build`` makes from its source with ``DS_BUILD_OPS=0`` (and ``DS_ACCELERATOR=cuda``,
so it describes the GPU machine, not this one): pure Python, no compiled op. DeepSpeed would compile an op on first
use, which needs a CUDA toolkit; the GPU check's optimizer is torch's AdamW, so it uses none. ``build`` refuses a
DeepSpeed wheel that holds a compiled file or says an op was built.

``install`` runs ``pip install --no-index --find-links <wheels>`` on this package, the tested TRL and DeepSpeed: pip
keeps every installed release that satisfies the pins and takes the rest from the folder.
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
LIMIT_BYTES = 64 * MIB  # what one call to the device machine carries, working tree and carried folders together
PYTHON_VERSION = "3.12"  # the GPU image's python3 (3.12.3)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")


def marker_environment(python_version: str) -> dict[str, str]:
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }


# What the GPU machine lacks, at the releases this package is tested with; datasets 4.7.0 is the lowest the pins allow
# and the fallback where the image's pyarrow is older than datasets 5.2.0 needs (>= 24).
ROOTS = ("trl==1.16.0", "datasets==5.2.0", "datasets==4.7.0", "math-verify==0.9.0")
FALLBACK_MAX_BYTES = 2 * MIB
DEEPSPEED = "deepspeed==0.19.8"  # the release the CPU suite's ZeRO runs use
# The Python packages of the GPU machines' image ('cuda'), as listed on 2026-11-17.
DEVICE_PACKAGES = frozenset(
    [
        "absl-py",
        "accelerate",
        "aiofiles",
        "aiohappyeyeballs",
        "aiohttp",
        "aiosignal",
        "annotated-doc",
        "anyio",
        "attrs",
        "botorch",
        "build",
        "certifi",
        "charset-normalizer",
        "chex",
        "click",
        "cloudpickle",
        "cmake",
        "colorama",
        "contourpy",
        "coverage",
        "cuda-bindings",
        "cuda-core",
        "cuda-pathfinder",
        "cuda-toolkit",
        "cupy-cuda13x",
        "cycler",
        "cython",
        "diffrax",
        "e3nn",
        "einops",
        "equinox",
        "etils",
        "execnet",
        "filelock",
        "flatbuffers",
        "flax",
        "fonttools",
        "formulaic",
        "frozenlist",
        "fsspec",
        "gpytorch",
        "grpcio",
        "h11",
        "h5py",
        "hf-xet",
        "httpcore",
        "httpx",
        "huggingface-hub",
        "humanize",
        "hypothesis",
        "idna",
        "imageio",
        "iniconfig",
        "interface-meta",
        "jax",
        "jax-cuda13-pjrt",
        "jax-cuda13-plugin",
        "jaxlib",
        "jaxtyping",
        "jinja2",
        "joblib",
        "kiwisolver",
        "lazy-loader",
        "lightning",
        "lightning-utilities",
        "linear-operator",
        "lineax",
        "llvmlite",
        "lxml",
        "markdown",
        "markdown-it-py",
        "markupsafe",
        "matplotlib",
        "mdurl",
        "meson",
        "ml-dtypes",
        "mpi4py",
        "mpmath",
        "msgpack",
        "multidict",
        "multipledispatch",
        "mypy-extensions",
        "nanobind",
        "narwhals",
        "networkx",
        "ninja",
        "numba",
        "numba-cuda",
        "numpy",
        "numpyro",
        "nvidia-cublas",
        "nvidia-cuda-cupti",
        "nvidia-cuda-nvrtc",
        "nvidia-cuda-runtime",
        "nvidia-cudnn-cu13",
        "nvidia-cufft",
        "nvidia-cufile",
        "nvidia-curand",
        "nvidia-cusolver",
        "nvidia-cusparse",
        "nvidia-cusparselt-cu13",
        "nvidia-ml-py",
        "nvidia-nccl-cu13",
        "nvidia-nvjitlink",
        "nvidia-nvshmem-cu13",
        "nvidia-nvtx",
        "onnx",
        "onnx-ir",
        "onnxruntime",
        "onnxscript",
        "opencv-python-headless",
        "optax",
        "opt-einsum",
        "opt-einsum-fx",
        "optimistix",
        "orbax-checkpoint",
        "packaging",
        "pandas",
        "pathspec",
        "patsy",
        "peft",
        "pillow",
        "pip",
        "pluggy",
        "portalocker",
        "prometheus-client",
        "propcache",
        "protobuf",
        "psutil",
        "pyarrow",
        "pybind11",
        "py-cpuinfo",
        "pygments",
        "pyparsing",
        "pyproject-hooks",
        "pyre-extensions",
        "pytest",
        "pytest-benchmark",
        "pytest-cov",
        "pytest-mock",
        "pytest-timeout",
        "pytest-xdist",
        "python-dateutil",
        "pytorch-lightning",
        "pyyaml",
        "regex",
        "requests",
        "rich",
        "sacrebleu",
        "safetensors",
        "scikit-build-core",
        "scikit-image",
        "scikit-learn",
        "scipy",
        "seaborn",
        "sentencepiece",
        "sentence-transformers",
        "setuptools",
        "shellingham",
        "simplejson",
        "six",
        "sortedcontainers",
        "statsmodels",
        "sympy",
        "tabulate",
        "tensorboard",
        "tensorboard-data-server",
        "tensorstore",
        "threadpoolctl",
        "tifffile",
        "tiktoken",
        "timm",
        "tokenizers",
        "toolz",
        "torch",
        "torchaudio",
        "torchdiffeq",
        "torch-geometric",
        "torchmetrics",
        "torchvision",
        "tqdm",
        "transformers",
        "treescope",
        "triton",
        "typer",
        "typing-extensions",
        "typing-inspect",
        "urllib3",
        "uvloop",
        "wadler-lindig",
        "werkzeug",
        "wheel",
        "wrapt",
        "xarray",
        "xxhash",
        "yarl",
        "zipp",
    ]
)


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheel_requirements(
    wheel: Path, extras: frozenset[str] = frozenset(), python_version: str = PYTHON_VERSION
) -> list[str]:
    """The Requires-Dist lines of ``wheel`` that apply on the GPU machine's Python (with ``extras`` asked for)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    needed = []
    for line in metadata.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is None or any(
            requirement.marker.evaluate({**marker_environment(python_version), "extra": extra})
            for extra in ("", *extras)
        ):
            needed.append(line.split(";")[0].strip())
    return needed


def travelling_bytes(root: Path = ROOT) -> int:
    """Bytes of what a device call sends besides carried folders: tracked files and untracked, not ignored ones."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    return sum((root / name).stat().st_size for name in listed if name and (root / name).is_file())


def check_size(folder: Path, tree_bytes: int) -> int:
    """The folder's size in bytes; a ``SystemExit`` naming the overrun when it cannot travel with the tree."""
    size = sum(path.stat().st_size for path in folder.iterdir() if path.is_file())
    room = LIMIT_BYTES - tree_bytes
    if size > LIMIT_BYTES or size > room:
        raise SystemExit(
            f"The wheel folder {folder} holds {size / MIB:.1f} MiB; one device call carries at most 64 MiB, and the "
            f"working tree already takes {tree_bytes / MIB:.1f} MiB of it, leaving {room / MIB:.1f} MiB. Carry fewer "
            "wheels, or make the tree smaller (untracked files count unless ignored)."
        )
    return size


def pip_download(requirement: str, out: Path, python_version: str = PYTHON_VERSION) -> Path:
    """Download one wheel for the GPU machine's Python, without dependencies; returns its path."""
    before = set(out.iterdir())
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--abi",
        f"cp{python_version.replace('.', '')}",
        "-d",
        str(out),
        *(f"--platform={platform}" for platform in PLATFORMS),
        requirement,
    ]
    subprocess.run(command, check=True)
    new = set(out.iterdir()) - before
    if new:
        return new.pop()
    # Already there from an earlier requirement: the newest wheel of that name that fits.
    from packaging.requirements import Requirement
    from packaging.version import Version

    wanted = Requirement(requirement)
    fitting = [
        path
        for path in out.glob("*.whl")
        if canonical(path.name.split("-")[0]) == canonical(wanted.name)
        and wanted.specifier.contains(path.name.split("-")[1], prereleases=True)
    ]
    if not fitting:
        raise RuntimeError(f"pip downloaded nothing for {requirement!r}.")
    return max(fitting, key=lambda path: Version(path.name.split("-")[1]))


def build_deepspeed_wheel(out: Path, requirement: str = DEEPSPEED) -> Path:
    """DeepSpeed built from its source without ops, for a CUDA machine; a ``SystemExit`` if the wheel is not pure."""
    before = set(out.iterdir())
    env = {**os.environ, "DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cuda"}
    # No cache: pip would reuse a wheel built earlier with other settings (another accelerator, or with ops).
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-cache-dir",
        "--no-binary",
        "deepspeed",
    ]
    subprocess.run([*command, "-w", str(out), requirement], check=True, env=env)
    wheel = next(path for path in set(out.iterdir()) - before if path.name.startswith("deepspeed-"))
    problem = deepspeed_wheel_problem(wheel)
    if problem:
        wheel.unlink()
        raise SystemExit(
            f"The DeepSpeed wheel built from {requirement} {problem}; it must be built with DS_BUILD_OPS=0 and "
            "DS_ACCELERATOR=cuda, as this function does (a wheel pip reused from its cache can differ)."
        )
    return wheel


def deepspeed_wheel_problem(wheel: Path) -> str | None:
    """What makes ``wheel`` unfit to carry: a compiled file, an op marked as built, or another accelerator."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = archive.read("deepspeed/git_version_info_installed.py").decode()
    compiled = [name for name in names if name.endswith((".so", ".pyd", ".dll"))]
    if compiled or not wheel.name.endswith("-none-any.whl"):
        return f"holds compiled files ({', '.join(compiled[:3]) or wheel.name})"
    values = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(info).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    built = [op for op, installed in values.get("installed_ops", {}).items() if installed]
    if built:
        return f"says these ops were built: {', '.join(built)}"
    if values.get("accelerator_name") != "cuda":
        return f"was built for the accelerator {values.get('accelerator_name')!r}, not 'cuda'"
    return None


def build(out: Path, python_version: str = PYTHON_VERSION) -> dict:
    """Fill ``out`` with the wheels for ``python_version`` (the GPU image's by default; another one to rehearse the
    install elsewhere); returns what was carried, what is left to the image, and the sizes."""
    from packaging.requirements import Requirement

    out.mkdir(parents=True, exist_ok=True)
    leftovers = [ROOT / "build", ROOT / "riskpo_trl.egg-info"]
    existed = [path.exists() for path in leftovers]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)], check=True
    )
    for path, was_there in zip(leftovers, existed):  # what setuptools left in the source tree
        if not was_there:
            shutil.rmtree(path, ignore_errors=True)
    own = next(out.glob("riskpo_trl-*.whl"))
    deepspeed = build_deepspeed_wheel(out)
    queue = list(ROOTS) + wheel_requirements(own, python_version=python_version)
    queue += wheel_requirements(deepspeed, python_version=python_version)
    seen: set[str] = {DEEPSPEED}
    carried, left_to_image, fallbacks = [own.name, deepspeed.name], set(), []
    while queue:
        line = queue.pop(0)
        if line in seen:
            continue
        seen.add(line)
        requirement = Requirement(line)
        name = canonical(requirement.name)
        if name in DEVICE_PACKAGES:
            left_to_image.add(name)
            if not requirement.specifier or name in {"torch", "transformers", "accelerate", "peft"}:
                continue
            wheel = pip_download(line, out, python_version)
            if not wheel.name.endswith("-none-any.whl") or wheel.stat().st_size > FALLBACK_MAX_BYTES:
                wheel.unlink()  # compiled or large: the image's release has to do
                continue
            fallbacks.append(wheel.name)
        else:
            wheel = pip_download(line, out, python_version)
            carried.append(wheel.name)
        queue += wheel_requirements(wheel, frozenset(requirement.extras), python_version)
    tree = travelling_bytes()
    size = check_size(out, tree)
    return {
        "folder": str(out),
        "size_mib": round(size / MIB, 2),
        "tree_mib": round(tree / MIB, 2),
        "carried": sorted(set(carried)),
        "fallbacks": sorted(set(fallbacks)),
        "left_to_image": sorted(left_to_image),
    }


def install(wheels: Path) -> int:
    """Install this package, the tested TRL and DeepSpeed from ``wheels`` alone (no index); pip's exit status."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-index",
        "--find-links",
        str(wheels.resolve()),
        "--disable-pip-version-check",
        "riskpo-trl",
        "trl==1.16.0",
        "math-verify",
        DEEPSPEED,
    ]
    print("[gpu_wheels]", " ".join(command), flush=True)
    # Not from the repository root: there `python -m pip` would take a riskpo_trl.egg-info for an installed package.
    return subprocess.run(command, cwd=tempfile.gettempdir()).returncode


def main(argv: list[str] | None = None) -> dict | int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    build_parser = commands.add_parser("build", help="download and build the wheels here (needs PyPI)")
    build_parser.add_argument("--out", type=Path, default=ROOT / ".whl", help="the wheel folder (default: .whl)")
    build_parser.add_argument(
        "--python-version",
        default=PYTHON_VERSION,
        help=f"the Python the wheels are for (default {PYTHON_VERSION}, the GPU image's)",
    )
    install_parser = commands.add_parser("install", help="install from the folder, without a network")
    install_parser.add_argument("--wheels", type=Path, default=ROOT / ".whl")
    args = parser.parse_args(argv)
    if args.command == "install":
        return install(args.wheels)
    summary = build(args.out, args.python_version)
    print(json.dumps(summary, indent=2))
    print(
        f"[gpu_wheels] {len(summary['carried'])} wheels and {len(summary['fallbacks'])} fallbacks, "
        f"{summary['size_mib']} MiB, beside a {summary['tree_mib']} MiB working tree (limit 64 MiB together)."
    )
    return summary


if __name__ == "__main__":
    result = main()
    sys.exit(result if isinstance(result, int) else 0)
