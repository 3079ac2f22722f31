"""Memory, process and CPU caps for a whole sandboxed program: cgroups of its own per run, on cgroup v2 or v1.

Per-process rlimits cannot bound a program: each of its processes gets the full ``RLIMIT_AS``, and memory that is not
mapped (memfds, SysV shared memory, tmpfs files) counts against no rlimit. A cgroup counts all of it, for all the
program's processes together. Each run has its own cgroup (reused by a later run once empty, `CgroupSupport.acquire`)
with ``memory_mb`` of memory (swap included where the kernel accounts it), ``max_processes`` tasks (threads count) and,
with the ``cpu`` controller, at most ``CPU_CORES_PER_RUN`` cores of CPU time (``cpu.max``; v1 ``cpu.cfs_quota_us``),
under one parent cgroup per trainer process. The scheduler then shares CPU time between runs, not between their
processes: a program that starts 16 busy processes gets no more CPU than one that runs one, so it cannot take a
concurrent run's share of it. The parent weighs as much as one busy thread per core of this training process (the cores
divided by ``LOCAL_WORLD_SIZE``, as for the default number of workers; ``cpu.weight``, v1 ``cpu.shares``), so the runs
together compete with the rest of the machine about as their single-threaded processes did without the controller.

* **cgroup v2** (most current hosts): the parent is made next to the trainer's own cgroup, in its parent, when that
  parent already delegates ``memory`` and ``pids`` (``cgroup.subtree_control``; ``cpu`` is used when delegated too),
  or, when the trainer sits in the root cgroup, under it. v2 forbids enabling controllers in a cgroup that holds
  processes, so the trainer's own cgroup is never used, and no controller is enabled in a cgroup this module did not
  create, other than the root.
* **cgroup v1**: a ``memory``, ``pids`` or ``cpu`` hierarchy that is mounted and writable; the parent goes under the
  trainer's own cgroup there.

Each controller is taken from whichever hierarchy offers it. Without root (or a delegated cgroup) or without a
controller, `CgroupSupport.missing` says why and the sandbox falls back to per-process rlimits (and, for CPU, to the
scheduler's per-thread sharing), which it states at start-up. A run's processes join its cgroups before bwrap forks
anything (the launcher holds bwrap until then).
"""

from __future__ import annotations

import atexit
import errno
import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CONTROLLERS = ("memory", "pids", "cpu")
EXTRA_TASKS = 2  # bwrap's monitor process and the runner itself, besides the program's max_processes
CPU_CORES_PER_RUN = 1  # a run's CPU cap: its runner and a program that needs no more than one core
CPU_PERIOD_US = 100_000  # the scheduler period the quota is counted in (the kernel's default)
V1_SHARES, V2_WEIGHT = 1024, 100  # the default weight of one cgroup (or one thread) on v1 and v2
V1_MAX_SHARES, V2_MAX_WEIGHT = 262_144, 10_000
PARENT_PREFIX = "riskpo-sandbox-"  # + "<trainer's PID>-<its PID namespace's inode>": its parent cgroup per hierarchy
KILL_WAIT_S = 5.0  # for the processes a dead trainer left in its cgroups to exit after SIGKILL


@dataclass(frozen=True)
class _Hierarchy:
    """Where one controller's per-run cgroups are made."""

    controller: str
    version: int  # 1 or 2
    parent: str  # the per-trainer-process parent cgroup directory


def _read(path: str) -> str:
    with open(path) as handle:
        return handle.read()


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _mounts(mountinfo: str) -> tuple[dict[str, tuple[str, str]], tuple[str, str] | None]:
    """({v1 controller: (mount point, mount root)}, (v2 mount point, mount root) or None) from mountinfo text."""
    v1: dict[str, tuple[str, str]] = {}
    v2 = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3:
            continue
        fstype, options = after[0], after[2].split(",")
        root, point = fields[3], fields[4].replace("\\040", " ")
        if fstype == "cgroup2" and v2 is None:
            v2 = (point, root)
        elif fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options and controller not in v1:
                    v1[controller] = (point, root)
    return v1, v2


def _own_cgroups(text: str) -> tuple[dict[str, str], str | None]:
    """({v1 controller: own path}, own v2 path or None) from /proc/self/cgroup text."""
    v1: dict[str, str] = {}
    v2 = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        for controller in parts[1].split(","):
            if controller in CONTROLLERS:
                v1[controller] = parts[2]
    return v1, v2


def _join(point: str, root: str, own: str) -> str:
    """The directory of cgroup ``own`` in a hierarchy mounted at ``point`` whose mount shows cgroup ``root``."""
    relative = own[len(root) :] if root != "/" and (own == root or own.startswith(root + "/")) else own
    return os.path.join(point, relative.lstrip("/"))


@dataclass
class CgroupSupport:
    """The cgroups this trainer process can give each run, and why any controller is missing."""

    hierarchies: dict[str, _Hierarchy] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # controller -> reason
    _runs: itertools.count = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _free: dict[tuple[int, int, int], list[RunCgroup]] = field(default_factory=dict)  # (pid, caps) -> emptied ones
    # controller -> the cgroup directories whose limits the programs share with the trainer, innermost first
    shared: dict[str, list[tuple[int, str]]] = field(default_factory=dict)

    @property
    def bounds_memory(self) -> bool:
        return "memory" in self.hierarchies

    @property
    def bounds_processes(self) -> bool:
        return "pids" in self.hierarchies

    @property
    def bounds_cpu(self) -> bool:
        return "cpu" in self.hierarchies

    def describe(self) -> str:
        """One line for start-up logs and `Isolation.describe`."""
        used = [f"{name} (cgroup v{h.version})" for name, h in sorted(self.hierarchies.items())]
        parts = [f"whole-program caps: {', '.join(used)}"] if used else []
        if self.missing:
            parts.append("no cgroup for " + "; ".join(f"{name}: {why}" for name, why in sorted(self.missing.items())))
        return "; ".join(parts)

    def acquire(self, memory_bytes: int, max_tasks: int) -> RunCgroup:
        """Cgroups with the run's caps for one run: an emptied one given back by `release`, else new ones.

        Reuse saves making and removing a directory per controller each run (about half a millisecond of CPU, and the
        kernel's work to tear the cgroup down). A cgroup is reused only once every process of its run is gone, so it
        starts with no task and with none of the run's files (its working directory is unmounted by then): what it
        keeps is kernel bookkeeping (counters, and page cache of the shared interpreter files charged to it, which is
        reclaimed before the cap is ever hit).
        """
        with self._lock:
            free = self._free.get((os.getpid(), memory_bytes, max_tasks))
            if free:
                return free.pop()
        run = self.create(memory_bytes, max_tasks)
        run.caps = (memory_bytes, max_tasks)
        return run

    def release(self, run: RunCgroup) -> None:
        """Give back cgroups from `acquire` once the run's processes are all reaped: kept for the next run if they are
        empty, else removed (never raises)."""
        if run.caps is None or not run.paths or not run.empty():
            run.remove()
            return
        with self._lock:
            self._free.setdefault((os.getpid(), *run.caps), []).append(run)

    def create(self, memory_bytes: int, max_tasks: int) -> RunCgroup:
        """A fresh cgroup per available controller with the run's caps (raises OSError if the kernel refuses)."""
        with self._lock:
            name = f"run{os.getpid()}-{next(self._runs)}"  # unique also across forks
        run = RunCgroup([])
        try:
            for controller, hierarchy in sorted(self.hierarchies.items()):
                path = os.path.join(hierarchy.parent, name)
                if path not in run.paths:  # v2: one directory holds both controllers
                    os.mkdir(path)
                    run.paths.append(path)
                _set_limits(hierarchy, path, memory_bytes, max_tasks)
        except OSError:
            run.remove()
            raise
        return run


@dataclass
class RunCgroup:
    """The cgroup directories of one run (one per controller hierarchy)."""

    paths: list[str]
    caps: tuple[int, int] | None = None  # (memory bytes, tasks) when made by `CgroupSupport.acquire`

    def empty(self) -> bool:
        """Whether no process is left in any of the directories."""
        try:
            return all(not _read(os.path.join(path, "cgroup.procs")).strip() for path in self.paths)
        except OSError:
            return False

    def add(self, pid: int) -> None:
        """Move process ``pid`` (and so everything it starts afterwards) into the run's cgroups."""
        for path in self.paths:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def kill(self) -> None:
        """SIGKILL every process in the directories, and wait up to `KILL_WAIT_S` for them to leave (never raises)."""
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            pids = set()
            for path in self.paths:
                try:
                    pids.update(int(pid) for pid in _read(os.path.join(path, "cgroup.procs")).split())
                except (OSError, ValueError):
                    pass
            if not pids or time.monotonic() > deadline:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        """Remove the directories once their processes are gone (retried briefly; never raises)."""
        for path in reversed(self.paths):
            for attempt in range(50):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or attempt == 49:
                        logger.warning("Could not remove the sandbox cgroup %s: %s", path, exc)
                        break
                    time.sleep(0.02)
        self.paths = []


def _set_limits(hierarchy: _Hierarchy, path: str, memory_bytes: int, max_tasks: int) -> None:
    if hierarchy.controller == "pids":
        _write(os.path.join(path, "pids.max"), str(max_tasks))
    elif hierarchy.controller == "cpu":
        quota = CPU_CORES_PER_RUN * CPU_PERIOD_US
        if hierarchy.version == 2:
            _write(os.path.join(path, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        else:
            _write(os.path.join(path, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            try:
                _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))
            except OSError as exc:  # v1 refuses a quota above an ancestor's, which then caps the run more tightly
                if exc.errno != errno.EINVAL:
                    raise
    elif hierarchy.version == 2:
        _write(os.path.join(path, "memory.max"), str(memory_bytes))
        _write_optional(os.path.join(path, "memory.swap.max"), "0")
        _write_optional(os.path.join(path, "memory.oom.group"), "1")  # an OOM kill ends the whole program
    else:
        _write(os.path.join(path, "memory.limit_in_bytes"), str(memory_bytes))
        _write_optional(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory_bytes))  # RAM + swap


def _write_optional(path: str, value: str) -> None:
    """Files that exist only with swap accounting or newer kernels."""
    try:
        _write(path, value)
    except OSError:
        pass


def _make_parent(directory: str, version: int, controllers: tuple[str, ...]) -> str:
    """The per-trainer-process parent cgroup in ``directory``; v2: with ``controllers`` enabled for its children.
    First removes what SIGKILLed trainers left there (`remove_orphaned_parents`)."""
    remove_orphaned_parents(directory)
    parent = os.path.join(directory, parent_name())
    os.makedirs(parent, exist_ok=True)
    atexit.register(_remove_parent, parent)
    if version == 2:
        _write(os.path.join(parent, "cgroup.subtree_control"), " ".join(f"+{c}" for c in controllers))
    if "cpu" in controllers:  # the runs together weigh as much as one busy thread per core of this training process
        cores = max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        if version == 2:
            _write(os.path.join(parent, "cpu.weight"), str(min(V2_MAX_WEIGHT, V2_WEIGHT * cores)))
        else:
            _write(os.path.join(parent, "cpu.shares"), str(min(V1_MAX_SHARES, V1_SHARES * cores)))
    return parent


def parent_name(pid: int | None = None) -> str:
    """The name of the parent cgroup of trainer ``pid`` (default: this process) of this PID namespace."""
    return f"{PARENT_PREFIX}{os.getpid() if pid is None else pid}-{_pid_namespace()}"


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def remove_orphaned_parents(directory: str) -> list[str]:
    """Remove the parent cgroups in ``directory`` of trainers that no longer run (a SIGKILL skips the exit hook):
    every process still in their run cgroups (a sandbox left behind) is killed, then the cgroups are removed. Only
    parents of this PID namespace are looked at (their name says), where a PID that runs no process means the trainer
    is gone. Returns the parents removed; never raises."""
    removed = []
    suffix = f"-{_pid_namespace()}"
    try:
        entries = [entry for entry in os.scandir(directory) if entry.name.startswith(PARENT_PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        pid = entry.name[len(PARENT_PREFIX) : -len(suffix)]
        if not entry.name.endswith(suffix) or not pid.isdigit() or _pid_runs(int(pid)):
            continue
        if not entry.is_dir(follow_symlinks=False):
            continue
        runs = [RunCgroup([child.path]) for child in os.scandir(entry.path) if child.is_dir(follow_symlinks=False)]
        for run in runs:
            run.kill()
        for run in runs:
            run.remove()
        try:
            os.rmdir(entry.path)
            removed.append(entry.path)
        except OSError as exc:
            logger.warning("Could not remove the cgroup %s of a trainer that no longer runs: %s", entry.path, exc)
    if removed:
        logger.info("Removed the sandbox cgroups of %d trainer(s) that no longer run: %s", len(removed), removed)
    return removed


OOM_SCORE_ADJ = 1000  # the most: the OOM killer picks a sandbox's process before any process of the trainer


def make_oom_victim(pid: int) -> None:
    """Make process ``pid`` (and what it forks later, which inherits it) the OOM killer's first choice: a program that
    fills a memory limit it shares with the trainer (a container's) is killed, not the trainer. Raising the score
    needs no privilege; a process this one may not change (a setuid bwrap) keeps its own (never raises)."""
    try:
        _write(f"/proc/{pid}/oom_score_adj", str(OOM_SCORE_ADJ))
    except OSError as exc:
        logger.debug("Could not raise the OOM score of sandbox process %d: %s", pid, exc)


UNLIMITED = 1 << 60  # v1 writes "no limit" as a page-rounded 2**63 - 1
_LIMIT_FILES = {  # (controller, version) -> (limit file, usage file)
    ("memory", 1): ("memory.limit_in_bytes", "memory.usage_in_bytes"),
    ("memory", 2): ("memory.max", "memory.current"),
    ("pids", 1): ("pids.max", "pids.current"),
    ("pids", 2): ("pids.max", "pids.current"),
}


@dataclass(frozen=True)
class SharedLimit:
    """A cgroup limit that the programs share with the trainer: the trainer's own cgroup or one of its ancestors."""

    controller: str  # "memory" (bytes) or "pids" (tasks)
    path: str
    limit: int
    usage: int


def shared_limits(support: CgroupSupport) -> list[SharedLimit]:
    """Every memory and pids limit above the programs' processes (their run cgroups', or, without them, the trainer's
    own cgroup) up to the hierarchy's mount point: each is shared by the trainer and every program at once."""
    found = []
    for controller, directories in support.shared.items():
        for version, directory in directories:
            limit_file, usage_file = _LIMIT_FILES[(controller, version)]
            try:
                limit_text = _read(os.path.join(directory, limit_file)).strip()
                usage = int(_read(os.path.join(directory, usage_file)).strip())
            except (OSError, ValueError):
                continue
            if limit_text != "max" and limit_text.isdigit() and int(limit_text) < UNLIMITED:
                found.append(SharedLimit(controller, directory, int(limit_text), usage))
    return found


def _ancestors(directory: str, point: str) -> list[str]:
    """``directory`` and its parents up to (and including) the mount point ``point``."""
    found = []
    directory = directory.rstrip("/") or "/"
    while True:
        found.append(directory)
        if directory == point.rstrip("/") or len(directory) <= len(point.rstrip("/")) or directory == "/":
            return found
        directory = os.path.dirname(directory)


def orphaned_owner(proc_cgroup: str) -> int | None:
    """The PID of the trainer that made the run cgroup a process sits in (its /proc/<pid>/cgroup text), when that
    trainer is of this PID namespace and no longer runs; else None (not a sandbox's cgroup, another namespace's, or a
    live trainer's: nothing proves the process is left over)."""
    suffix = f"-{_pid_namespace()}"
    for line in proc_cgroup.splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            if part.startswith(PARENT_PREFIX) and part.endswith(suffix):
                pid = part[len(PARENT_PREFIX) : -len(suffix)]
                if pid.isdigit() and not _pid_runs(int(pid)):
                    return int(pid)
    return None


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_parent(parent: str) -> None:
    """At exit: the parent and any run cgroup left in it (quietly: the interpreter is ending)."""
    try:
        for entry in os.scandir(parent):
            if entry.is_dir(follow_symlinks=False):
                os.rmdir(entry.path)
        os.rmdir(parent)
    except OSError:
        pass


REQUIRED_V2 = ("memory", "pids")  # v2 is used for these two together or not at all; cpu joins them when it can


def _v2_parent_dir(point: str, root: str, own: str) -> tuple[str | None, tuple[str, ...], str]:
    """A v2 cgroup whose children get memory and pids (and cpu where it can): (directory, controllers, "") or
    (None, (), why not)."""
    own_dir = _join(point, root, own)
    in_root = own in ("/", "")  # the root cgroup may hold processes and enable controllers at once
    directory = own_dir if in_root else os.path.dirname(own_dir.rstrip("/"))
    try:
        enabled = set(_read(os.path.join(directory, "cgroup.subtree_control")).split())
        available = set(_read(os.path.join(directory, "cgroup.controllers")).split())
    except OSError as exc:
        return None, (), f"cannot read {directory}: {exc.strerror}"
    if not set(REQUIRED_V2) <= available:
        return None, (), f"the v2 hierarchy offers {sorted(available) or 'no controllers'}"
    if not set(REQUIRED_V2) <= enabled:
        if not in_root:
            return (
                None,
                (),
                (
                    "the cgroup v2 parent of the trainer's cgroup does not delegate memory and pids "
                    "(cgroup.subtree_control); see docs/code_sandbox.md"
                ),
            )
        try:
            _write(os.path.join(directory, "cgroup.subtree_control"), "+memory +pids")
        except OSError as exc:
            return None, (), f"cannot enable memory and pids in {directory}: {exc.strerror}"
    if not os.access(directory, os.W_OK):
        return None, (), f"no write access to {directory} (not root, and no delegated cgroup)"
    controllers = REQUIRED_V2
    if "cpu" in available and ("cpu" in enabled or _try_enable(directory, "cpu", in_root)):
        controllers += ("cpu",)
    return directory, controllers, ""


def _try_enable(directory: str, controller: str, in_root: bool) -> bool:
    """Enable ``controller`` for the root cgroup's children (the only cgroup not made here where that is allowed)."""
    if not in_root:
        return False
    try:
        _write(os.path.join(directory, "cgroup.subtree_control"), f"+{controller}")
        return True
    except OSError:  # e.g. the cpu controller while realtime threads sit in non-root cgroups
        return False


def _v2_missing_reason(available_reason: str, controller: str) -> str:
    return available_reason or f"the cgroup v2 hierarchy does not offer or delegate {controller}"


def _find_shared(support: CgroupSupport, v1_mounts, v2_mount, v1_own, v2_own) -> None:
    """Where the programs' memory and pids are counted besides their own caps: the cgroups from the trainer's own (v1)
    or its parent (v2, where the runs are its siblings) up to the mount point, in each hierarchy that counts them."""
    for controller in ("memory", "pids"):
        directories = []
        if v2_mount is not None and v2_own is not None:
            own = _join(*v2_mount, v2_own)
            siblings = controller in support.hierarchies and v2_own not in ("/", "")  # runs next to the trainer's
            start = os.path.dirname(own.rstrip("/")) if siblings else own
            directories += [(2, path) for path in _ancestors(start, v2_mount[0])]
        if controller in v1_mounts and controller in v1_own:
            point = v1_mounts[controller][0]
            directories += [(1, path) for path in _ancestors(_join(*v1_mounts[controller], v1_own[controller]), point)]
        support.shared[controller] = directories


def detect(mountinfo_path: str = "/proc/self/mountinfo", cgroup_path: str = "/proc/self/cgroup") -> CgroupSupport:
    """Find, per controller, a hierarchy where this process can make per-run cgroups (v2 first, then v1)."""
    support = CgroupSupport()
    try:
        v1_mounts, v2_mount = _mounts(_read(mountinfo_path))
        v1_own, v2_own = _own_cgroups(_read(cgroup_path))
    except OSError as exc:
        support.missing = dict.fromkeys(CONTROLLERS, f"cannot read the cgroup mounts: {exc.strerror}")
        return support
    v2_reason = "no cgroup v2 hierarchy is mounted"
    if v2_mount is not None and v2_own is not None:
        directory, controllers, v2_reason = _v2_parent_dir(*v2_mount, v2_own)
        if directory is not None:
            try:
                parent = _make_parent(directory, 2, controllers)
                support.hierarchies = {c: _Hierarchy(c, 2, parent) for c in controllers}
            except OSError as exc:
                v2_reason = f"cannot create a cgroup in {directory}: {exc.strerror}"
    _find_shared(support, v1_mounts, v2_mount, v1_own, v2_own)
    for controller in CONTROLLERS:
        if controller in support.hierarchies:
            continue
        reason = _v2_missing_reason(v2_reason, controller)
        if controller not in v1_mounts or controller not in v1_own:
            support.missing[controller] = f"{reason}; no cgroup v1 {controller} hierarchy is mounted"
            continue
        directory = _join(*v1_mounts[controller], v1_own[controller])
        try:
            support.hierarchies[controller] = _Hierarchy(controller, 1, _make_parent(directory, 1, (controller,)))
        except OSError as exc:
            support.missing[controller] = (
                f"{reason}; cannot create a cgroup v1 {controller} group in {directory}: {exc.strerror} (not root?)"
            )
    return support
