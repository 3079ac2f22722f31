"""Start a command inside a bubblewrap (``bwrap``) sandbox: the OS boundary of the code sandbox.

Each run gets fresh user, PID, IPC, UTS and cgroup namespaces, a network namespace apart from the host's (its own, or
as root with the seccomp filter, which refuses every socket, one with no interface up shared by the runs), no
capabilities, an unprivileged uid, a private ``/proc``, a minimal ``/dev``, a new session, a seccomp filter
(`riskpo_trl.code.seccomp`), and a root filesystem that holds only read-only binds of what this Python interpreter
needs (its binary, standard library and the shared libraries they link) plus a size-limited tmpfs as the writable
working directory (and ``/dev/shm``). Site-packages are hidden and nothing of the trainer (datasets, checkpoints, the
package itself) is mounted. The command runs as the namespace's PID 1 (``--as-pid-1``), so the only process a program
can see besides its own children is the runner it runs in; bwrap and its helpers start with an empty environment, so no
variable of the trainer (tokens, keys) exists in any process of the sandbox.

bwrap reads its options from a pipe (``--args``), which holds it before it forks anything: the sandbox moves it into
the run's cgroup first (`riskpo_trl.code.cgroups`), then writes the options.

Run as root (CI, many cluster containers), the sandbox also leaves root on the host: bwrap starts as an unprivileged
uid per worker slot, so the sandbox's uid maps to that uid and not to root (RLIMIT_NPROC then applies; for root it does
not). bwrap then starts (`riskpo_trl.code.spawner`) inside a private mount namespace, set up once per process, that
holds bind mounts of an interpreter under a directory other users cannot enter (a pyenv install in root's home
directory) and, per run, a tmpfs capped in bytes and in files (``nr_inodes``, which bwrap's own ``--size`` tmpfs cannot
cap) that holds both the working directory and ``/dev/shm``.
"""

from __future__ import annotations

import atexit
import glob
import itertools
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

from .fdwait import readable
from .spawner import Spawner

logger = logging.getLogger(__name__)

SANDBOX_UID_BASE = 61000  # host uids per worker slot when running as root; no account needs to exist
SANDBOX_UID_SPAN = 4096  # the slots whose uids the start-up clean-up looks at (`kill_orphaned_sandbox_processes`)
INSIDE_UID = 1000  # the uid programs see inside the sandbox
WORKDIR = "/sandbox"  # the tmpfs working directory (also HOME and TMPDIR) inside the sandbox
SHM_DIR = "/dev/shm"  # POSIX shared memory and semaphores (multiprocessing); writable, capped like WORKDIR
SHM_SHARE = 8  # without root, /dev/shm is its own tmpfs of 1/SHM_SHARE of disk_mb; the working directory the rest
DEVICE_NODES = ("null", "zero", "full", "random", "urandom")
DEVICE_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)
# What helper commands (mount, mkdir, ...) get as their environment; bwrap itself gets none at all.
TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
STAGE_SERVER = Path(__file__).with_name("_stage_main.py").read_text()
STAGE_TIMEOUT_S = 30.0  # for one mount or unmount (system calls that take milliseconds)

INSTALL_HINT = (
    "The code sandbox needs bubblewrap: install the distribution package 'bubblewrap' (Debian/Ubuntu: "
    "`apt-get install bubblewrap`; Fedora/RHEL: `dnf install bubblewrap`). bwrap needs unprivileged user namespaces "
    "(or root): check `sysctl user.max_user_namespaces` (> 0) and, on older Debian kernels, "
    "`kernel.unprivileged_userns_clone=1`; on Ubuntu 24.04 AppArmor also blocks them unless "
    "`kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile allows bwrap. In a container, run it "
    "with user namespaces allowed (e.g. Docker's default seccomp profile blocks them: use a profile that allows "
    "clone/unshare of user namespaces). Only for trusted, test-only code: Sandbox(isolation='none')."
)


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or cannot create its namespaces on this machine."""


def _ldd_libraries(paths: list[str]) -> set[str]:
    """Absolute paths of the shared libraries (and the ELF interpreter) that ``paths`` link, as ldd names them."""
    found: set[str] = set()
    ldd = shutil.which("ldd")
    if ldd is None or not paths:
        return found
    try:
        text = subprocess.run([ldd, *paths], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return found
    for match in re.finditer(r"(?:=>\s*)?(/\S+)\s+\(0x", text):
        found.add(match.group(1))
    return found


def _symlinks_along(path: str, limit: int = 40) -> list[tuple[str, str]]:
    """(target, link) for every symlink met while resolving ``path``, so the sandbox can recreate them."""
    links, pending = [], [os.path.normpath(path)]
    while pending and len(links) < limit:
        parts = pending.pop().strip("/").split("/")
        current = "/"
        for index, part in enumerate(parts):
            current = os.path.join(current, part)
            if os.path.islink(current):
                target = os.readlink(current)
                links.append((target, current))
                pending.append(os.path.normpath(os.path.join(os.path.dirname(current), target, *parts[index + 1 :])))
                break
    return links


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _outermost(paths: set[str]) -> list[str]:
    """The paths not inside another one of them, sorted."""
    kept: list[str] = []
    for path in sorted(paths, key=len):
        if not any(_inside(path, outer) for outer in kept):
            kept.append(path)
    return sorted(kept)


def interpreter_mounts() -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """What this interpreter needs inside the sandbox: (directories to bind read-only, (target, link) symlinks to
    recreate, site-packages directories to hide under an empty tmpfs)."""
    executable = os.path.realpath(sys.executable)
    stdlib = {
        os.path.realpath(sysconfig.get_path(name, vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix}))
        for name in ("stdlib", "platstdlib")
    }
    extensions = sorted(
        path for directory in stdlib for path in glob.glob(os.path.join(directory, "lib-dynload", "*.so"))
    )
    libraries = _ldd_libraries([executable, *extensions])
    needed = {executable, *libraries}
    # the binary itself (not its directory: /usr/bin holds every tool), library directories, the standard library
    directories = {executable} | {os.path.dirname(os.path.realpath(path)) for path in libraries} | stdlib
    links: list[tuple[str, str]] = []
    for path in sorted(needed):
        links.extend(_symlinks_along(path))
    for optional in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(optional):
            directories.add(os.path.realpath(optional))  # a file: bwrap binds files too
            links.extend(_symlinks_along(optional))
    binds = _outermost(directories)
    unique_links = []
    for target, link in links:
        if (target, link) not in unique_links and not any(_inside(link, bound) for bound in binds):
            unique_links.append((target, link))
    site_dirs = {
        os.path.realpath(sysconfig.get_path(name, vars=vars_))
        for name in ("purelib", "platlib")
        for vars_ in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix})
    }
    hidden = sorted(path for path in site_dirs if os.path.isdir(path) and any(_inside(path, b) for b in binds))
    return binds, unique_links, hidden


def _enterable_by_others(path: str) -> bool:
    """Whether an unrelated uid can reach ``path``: every directory on the way has the others-execute bit."""
    current = "/"
    for part in os.path.realpath(path).strip("/").split("/")[:-1]:
        current = os.path.join(current, part)
        try:
            if not os.stat(current).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


# Where the staging directory may go when the temp directory is private (a per-job TMPDIR of mode 0700 on clusters):
# the sandbox's uid must be able to enter every directory on the way to its binds and working directories.
STAGE_PARENTS = ("/tmp", "/var/tmp", "/dev/shm")


def stage_parent() -> str:
    """The temp directory when every uid can enter it, else the first of `STAGE_PARENTS` they can."""
    for candidate in (tempfile.gettempdir(), *STAGE_PARENTS):
        if os.path.isdir(candidate) and _enterable_by_others(os.path.join(candidate, "stage")):
            return candidate
    raise SandboxUnavailableError(
        f"Running the code sandbox as root needs a temporary directory that other users can enter (the sandbox runs "
        f"as uid {SANDBOX_UID_BASE} + its slot): neither TMPDIR ({tempfile.gettempdir()}) nor any of {STAGE_PARENTS} "
        f"is one. Point TMPDIR at a directory with mode 755 or 1777 all the way down."
    )


def kill_orphaned_sandbox_processes() -> list[int]:
    """SIGKILL every process of the sandbox uids that provably belongs to a trainer that no longer runs, and return
    their PIDs (never raises).

    Proof of ownership is the run cgroup a process sits in: ``riskpo-sandbox-<trainer PID>-<PID namespace>``
    (`riskpo_trl.code.cgroups.parent_name`), named by the trainer that started it. A process is killed only when that
    name is of this PID namespace and its trainer PID runs no process, the rule the cgroups themselves are removed by.
    A parent PID says nothing: a trainer that is its container's PID 1 is the parent of its own sandboxes, and every
    orphan's parent too. A process outside such a cgroup (a host without cgroup controllers) is left alone: it dies
    with its PID namespace's PID 1, which dies with its bwrap (``--die-with-parent``). Run as root at start-up, before
    this process starts any sandbox.
    """
    from .cgroups import orphaned_owner  # the naming rule of the run cgroups

    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            uid = int(fields["Uid"].split()[0])
            if not SANDBOX_UID_BASE <= uid < SANDBOX_UID_BASE + SANDBOX_UID_SPAN:
                continue
            with open(f"/proc/{entry}/cgroup") as cgroup:
                owner = orphaned_owner(cgroup.read())
        except (OSError, ValueError, KeyError, IndexError):
            continue
        if owner is not None:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
            except OSError:
                pass
    if killed:
        logger.warning("Killed %d sandbox process(es) left by a trainer that no longer runs: %s", len(killed), killed)
    return killed


class BwrapLauncher:
    """Builds the command line that runs a program in a fresh bwrap sandbox (one per process, thread-safe)."""

    def __init__(self, bwrap: str):
        self.bwrap = bwrap
        self.as_root = os.geteuid() == 0
        self.binds, self.links, self.hidden = interpreter_mounts()
        self._stage: dict[str, str] = {}  # bind source -> its reachable copy in the staging mount namespace
        self._holder: _StageServer | None = None
        self.stage_dir: str | None = None
        self._lock = threading.Lock()
        self._runs = itertools.count()
        if self.as_root:
            self._start_holder([path for path in self.binds if not _enterable_by_others(path)])

    def _start_holder(self, private: list[str]) -> None:
        """A private mount namespace (root only) where ``private`` directories are also bind-mounted under a directory
        every uid can enter, and where each run gets a tmpfs capped in bytes *and* files; sandboxes start in it. Its
        first process is a staging server (`riskpo_trl.code._stage_main`) that lives while this process does (it
        serves requests on a pipe from us), and the namespace's mounts die with it."""
        kill_orphaned_sandbox_processes()
        self._tools = {}
        for tool in ("unshare", "nsenter"):
            self._tools[tool] = shutil.which(tool, path=TOOL_ENV["PATH"]) or shutil.which(tool)
            if self._tools[tool] is None:
                raise SandboxUnavailableError(
                    f"Running the code sandbox as root needs util-linux's `{tool}` (to start bwrap as an unprivileged "
                    "uid in a private mount namespace); install util-linux."
                )
        stage = tempfile.mkdtemp(prefix="riskpo-sandbox-stage-", dir=stage_parent())
        os.chmod(stage, 0o755)  # made 0700 under a random name (no one can have planted it), then opened to the uid
        self._stage = {path: f"{stage}/{index}" for index, path in enumerate(private)}
        self._holder = _StageServer(
            [self._tools["unshare"], "--mount", "--net", "--propagation", "private", "--"],
            ["--stage", stage, *private],
        )
        self._servers = {os.getpid(): self._holder}
        self._spawners: dict[int, Spawner] = {}
        self.stage_dir = stage
        atexit.register(self.close)
        error = self._holder.start_error
        if error is not None:
            raise SandboxUnavailableError(f"Could not stage the interpreter for the sandbox uid: {error}")

    def _server(self) -> _StageServer:
        """This process's staging server: the holder, or in a process forked from its owner, a server of its own
        started in the holder's namespace (two processes never share one request pipe)."""
        with self._lock:
            server = self._servers.get(os.getpid())
            if server is None or not server.alive():
                server = _StageServer(
                    [self._tools["nsenter"], f"--mount=/proc/{self._holder.pid}/ns/mnt", "--"], ["--serve"]
                )
                self._servers[os.getpid()] = server
            return server

    def _spawner(self) -> Spawner | None:
        """This process's spawner thread in the holder's namespaces, or None where it cannot exist (nsenter then)."""
        with self._lock:
            spawner = self._spawners.get(os.getpid())
            if spawner is None:
                spawner = self._spawners[os.getpid()] = Spawner(self._holder.pid)
            return spawner if spawner.usable else None

    def mount_workdir(self, slot: int, disk_bytes: int, max_files: int) -> str | None:
        """As root: a fresh tmpfs of ``disk_bytes`` and ``max_files`` inodes for one run of ``slot``, in the holder's
        namespace, holding ``home`` (the working directory) and ``shm`` (``/dev/shm``), both owned by the slot's uid:
        the path to bind, unique per run so concurrent runs never share one. None elsewhere: bwrap's own tmpfs caps
        bytes only."""
        if self._holder is None:
            return None
        with self._lock:
            path = f"{self.stage_dir}/work{os.getpid()}-{next(self._runs)}"  # unique also across forks
        error = self._server().request(
            op="mount", path=path, size=disk_bytes, inodes=max_files, uid=SANDBOX_UID_BASE + slot
        )
        if error is not None:
            raise SandboxUnavailableError(f"Could not mount the sandbox's working directory: {error}")
        return path

    def unmount_workdir(self, path: str | None) -> None:
        """Free a working directory from `mount_workdir` (never raises; the holder's end frees any left)."""
        if path is not None:
            self._server().request(op="umount", path=path)

    def command(
        self,
        argv: list[str],
        slot: int,
        disk_bytes: int,
        args_fd: int,
        info_fd: int | None = None,
        seccomp_fd: int | None = None,
        workdir: str | None = None,
    ) -> tuple[list[str], bytes]:
        """(bwrap command, bwrap's options) that run ``argv`` in a new sandbox for worker ``slot``: start the command
        with `popen`.

        bwrap reads its options from ``args_fd`` (an inherited pipe) until EOF and does nothing before: write the
        options there once the started process is where it belongs (its cgroup). With ``info_fd``, bwrap writes
        ``{"child-pid": ...}`` there: the host pid of the sandbox's PID 1. ``seccomp_fd`` holds a compiled filter
        (`riskpo_trl.code.seccomp`). With ``workdir`` (from `mount_workdir`), that tmpfs holds the working directory
        and ``/dev/shm``; else bwrap makes two of ``disk_bytes`` together.

        As root with a seccomp filter, sandboxes share the holder's network namespace, which has no interface up,
        rather than each making a fresh one (whose set-up and teardown cost about a millisecond and a half of CPU a
        run): the filter refuses every socket (`riskpo_trl.code.seccomp`), so no program can use a network namespace.
        """
        options = ["--info-fd", str(info_fd)] if info_fd is not None else []
        options += ["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []
        shared_net = self._holder is not None and seccomp_fd is not None
        options += (
            ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
            if shared_net
            else ["--unshare-all"]
        )
        options += [
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--cap-drop",
            "ALL",
            "--uid",
            str(INSIDE_UID),
            "--gid",
            str(INSIDE_UID),
            "--hostname",
            "sandbox",
            "--proc",
            "/proc",
        ]
        # /dev holds the basic nodes and the standard streams, as bwrap's --dev makes them, but no terminal (tty, pts,
        # ptmx): fewer mounts per run, and the root's final remount makes it read-only with the rest
        for node in DEVICE_NODES:
            options += ["--dev-bind", f"/dev/{node}", f"/dev/{node}"]
        for link, target in DEVICE_LINKS:
            options += ["--symlink", target, f"/dev/{link}"]
        for path in self.binds:
            options += ["--ro-bind", self._stage.get(path, path), path]
        for path in self.hidden:
            options += ["--tmpfs", path, "--remount-ro", path]
        for target, link in self.links:
            options += ["--symlink", target, link]
        # bwrap's own root and /dev are writable tmpfs without a size cap: the working directory and /dev/shm are the
        # only writable places left once they are read-only (remount-ro is not recursive)
        if workdir:
            options += ["--bind", f"{workdir}/home", WORKDIR, "--bind", f"{workdir}/shm", SHM_DIR]
        else:
            shm_bytes = max(1 << 20, disk_bytes // SHM_SHARE)
            options += [
                "--size",
                str(max(1 << 20, disk_bytes - shm_bytes)),
                "--tmpfs",
                WORKDIR,
                "--size",
                str(shm_bytes),
                "--tmpfs",
                SHM_DIR,
            ]
        options += [
            "--remount-ro",
            "/",
            "--chdir",
            WORKDIR,
            "--clearenv",
            "--setenv",
            "HOME",
            WORKDIR,
            "--setenv",
            "TMPDIR",
            WORKDIR,
            "--setenv",
            "PATH",
            "/usr/bin:/bin",
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--setenv",
            "PYTHONIOENCODING",
            "utf-8",
        ]
        bwrap = [self.bwrap, "--args", str(args_fd), "--", *argv]
        return bwrap, b"\0".join(option.encode() for option in options) + b"\0"

    def popen(self, command: list[str], slot: int, **popen_kwargs) -> subprocess.Popen:
        """Start a `command` for worker ``slot``, with an empty environment; as root, in the holder's mount and network
        namespaces, as the slot's uid (and gid, no supplementary groups)."""
        popen_kwargs["env"] = {}
        if self._holder is None:  # not root: bwrap runs as this user, whose uid the sandbox maps to
            return subprocess.Popen(command, **popen_kwargs)
        uid = SANDBOX_UID_BASE + slot
        spawner = self._spawner()
        if spawner is not None:
            return spawner.popen(uid, command, **popen_kwargs)
        return subprocess.Popen(
            [
                self._tools["nsenter"],
                f"--mount=/proc/{self._holder.pid}/ns/mnt",
                f"--net=/proc/{self._holder.pid}/ns/net",
                f"--setuid={uid}",
                f"--setgid={uid}",
                "--",
                *command,
            ],
            **popen_kwargs,
        )

    def close(self) -> None:
        """End the staging namespace (also at exit); the empty host directory it was mounted on is removed."""
        for pid, server in list(getattr(self, "_servers", {}).items()):
            if pid == os.getpid():
                server.close()
        for pid, spawner in list(getattr(self, "_spawners", {}).items()):
            if pid == os.getpid():
                spawner.close()
        try:
            holder = self._holder
            if (
                self.stage_dir is not None
                and holder is not None
                and holder.owner == os.getpid()
                and holder.process.poll() is not None
            ):
                os.rmdir(self.stage_dir)  # only where the holder is ours and has ended: never under a live stage
        except OSError:
            pass


class _StageServer:
    """A staging server process (`riskpo_trl.code._stage_main`), started by ``launcher`` (unshare or nsenter); one
    request at a time, each answered within `STAGE_TIMEOUT_S`."""

    def __init__(self, launcher: list[str], arguments: list[str]):
        self.owner = os.getpid()
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [*launcher, os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", STAGE_SERVER, *arguments],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env=TOOL_ENV,
            bufsize=0,
        )
        self.pid = self.process.pid
        reply = self._reply()
        self.start_error = reply.get("error")

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.process.poll() is None

    def request(self, **request) -> str | None:
        """Send one request; its error, or None when it was done."""
        with self._lock:
            try:
                self.process.stdin.write(json.dumps(request).encode() + b"\n")
                return self._reply().get("error")
            except OSError as exc:
                return f"the staging server is gone ({exc})"

    def _reply(self) -> dict:
        data, fd = b"", self.process.stdout.fileno()
        deadline = time.monotonic() + STAGE_TIMEOUT_S
        while not data.endswith(b"\n"):
            if not readable(fd, deadline - time.monotonic()):
                self.process.kill()
                return {"error": f"the staging server did not answer within {STAGE_TIMEOUT_S:.0f} s"}
            chunk = os.read(fd, 4096)
            if not chunk:
                self.process.wait()
                stderr = self.process.stderr.read().decode(errors="replace").strip()[-500:]
                return {"error": f"the staging server exited ({stderr or 'no message'})"}
            data += chunk
        try:
            return json.loads(data)
        except ValueError:
            return {"error": f"the staging server answered {data[:200]!r}"}

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.stdin.close()
                self.process.wait(timeout=5)
        except (OSError, subprocess.SubprocessError):
            pass
