"""One training run per output directory: a lock file taken at start-up and removed at exit.

Two runs writing into one ``output_dir`` would each resume from (or overwrite) the other's checkpoints. The lock is a
file, ``output_dir/_riskpo_run.lock``, created with ``O_CREAT | O_EXCL``: of two runs that start together exactly one
creates it. It holds the PID, the host, the boot id, the PID namespace and the start time of the run that took it, so
the second run's error names them. No ``flock``: on network filesystems (NFS, Lustre, GPFS) ``flock`` is often local to
one node or not supported, while an exclusive create is atomic on local filesystems and NFS v3 or later.

A run killed without cleaning up (SIGKILL, a node lost) leaves the file behind. When the lock was taken here (the
same host, boot id and PID namespace: only there does its PID mean the same process), the next run checks whether
that PID still runs (and is the same process, by its start time where ``/proc`` tells) and takes the lock over if
not. A lock left by an earlier start of the same SLURM job (requeued: the same ``SLURM_JOB_ID``, a higher
``SLURM_RESTART_COUNT``) is stale on any node. Any other lock cannot be checked from here (another host, another boot
or PID namespace: containers with host networking share a hostname; or a lock written before the boot id and namespace
were recorded, unless its PID runs here): the run is refused until the file is deleted by hand, which is the override
once that run is known to be dead. So is a lock naming a PID no process can have, and anything at the lock's path
that is not a regular file. The leading underscore keeps the file out of ``push_to_hub`` uploads.

Under ``accelerate launch`` only the main process takes the lock; the others learn the outcome from it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time
from collections.abc import Iterator

from .state_files import MAX_NESTING, UntrustedFileError, nesting_depth, read_regular_file, shown

LOCK_FILE = "_riskpo_run.lock"
# Holding this one (also an exclusive create) is what allows removing a stale lock, so that two runs that both find
# the same stale lock cannot both take over.
BREAK_SUFFIX = ".break"
STALE_BREAK_S = 30.0  # a break file older than this was left by a process that died while removing a stale lock
WRITE_GRACE_S = 5.0  # an empty or unreadable lock file younger than this is being written by its run
MAX_LOCK_BYTES = 64 * 1024  # a run's lock holds a few hundred bytes
PID_MAX_LIMIT = 1 << 22  # the kernel's highest pid_max (64-bit), where /proc/sys/kernel/pid_max cannot be read


class OutputDirLocked(FileExistsError):
    """Another run holds ``output_dir``'s lock."""


class RunLock:
    """The lock of ``output_dir`` held by this process; :meth:`release` removes it (only if it is still ours)."""

    def __init__(self, path: str, content: str):
        self.path, self.content = path, content

    def release(self) -> None:
        if _read_text(self.path) == self.content:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def acquire(output_dir: str) -> RunLock:
    """Take ``output_dir``'s lock (creating the directory), taking over a stale one; raise :class:`OutputDirLocked`
    naming the run that holds it."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    content = json.dumps(
        {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            **_machine_context(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "process_start": _process_start(os.getpid()),
            **_slurm_job(),
        }
    )
    deadline = time.monotonic() + 2 * WRITE_GRACE_S
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder_text = _read_lock(path)
            holder = _parse(holder_text)
            if holder_text is None or (holder is None and _age(path) < WRITE_GRACE_S):
                if time.monotonic() > deadline:
                    raise OutputDirLocked(f"Could not take the lock {path}: it keeps changing.") from None
                time.sleep(0.1)  # gone meanwhile, or being written: look again
                continue
            if holder is not None:
                _refuse_unless_stale(output_dir, path, holder)
            _remove_stale(path, holder_text)
            continue
        try:
            with os.fdopen(fd, "w") as file:
                file.write(content)
                file.flush()
                os.fsync(file.fileno())
        except OSError as exc:  # a full disk: leave no empty lock to delay the next start
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise OSError(exc.errno, f"Could not write the run lock {path}: {exc.strerror or exc}", path) from exc
        return RunLock(path, content)


@contextlib.contextmanager
def lock_output_dir(output_dir: str) -> Iterator[None]:
    """Hold ``output_dir``'s lock for the block. With several processes (``accelerate launch``) the main process
    takes it and every process raises the same :class:`OutputDirLocked` when it could not."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    lock, error = None, None
    if state.is_main_process:
        try:
            lock = acquire(output_dir)
        except OutputDirLocked as locked:
            error = str(locked)
    if state.num_processes > 1:
        [error] = broadcast_object_list([error])
    if error is not None:
        raise OutputDirLocked(error)
    try:
        yield
    finally:
        if lock is not None:
            lock.release()


def _in_use_message(output_dir: str, path: str, holder: dict) -> str:
    return (
        f"output_dir {output_dir} is in use by another run: PID {shown(holder.get('pid'), False)} on host "
        f"{shown(holder.get('host'), False)}, started {shown(holder.get('started'), False)}. Wait for it to finish, or choose another output_dir."
    )


def _refuse_unless_stale(output_dir: str, path: str, holder: dict) -> None:
    """Return when the run that took the lock has ended (the lock is stale); else raise :class:`OutputDirLocked`
    saying why, and what to do."""
    current = _slurm_job()
    if (
        current
        and holder.get("slurm_job_id") == current["slurm_job_id"]
        and _whole(holder.get("slurm_restart_count", 0)) < current["slurm_restart_count"]
    ):
        return  # an earlier start of this requeued job, on any node
    pid, pid_max = holder.get("pid"), _pid_max()
    if isinstance(pid, bool) or not isinstance(pid, int) or not 1 <= pid <= pid_max:
        raise OutputDirLocked(
            f"{path} names PID {shown(pid, False)}, which no process can have (PIDs run from 1 to {pid_max}): the file is "
            f"damaged or was edited. Once no run uses output_dir {output_dir}, delete {path}."
        )
    elsewhere = _taken_elsewhere(holder)
    runs_here = elsewhere is None or elsewhere == OLD_FORMAT
    if runs_here and _pid_runs(pid, holder.get("process_start")):
        raise OutputDirLocked(_in_use_message(output_dir, path, holder))
    if elsewhere is not None:
        raise OutputDirLocked(
            f"{_in_use_message(output_dir, path, holder)} It was taken {elsewhere}, so this run cannot tell whether "
            f"that run still runs; if it does not, delete {path}."
        )


OLD_FORMAT = "by an earlier version that did not record its boot id and PID namespace"


def _whole(value) -> int:
    """A count from the lock file, or a count no restart is below when it is not a whole number."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 1 << 62


def _taken_elsewhere(holder: dict) -> str | None:
    """Where the lock was taken, when its PID cannot be looked up here; None when it can."""
    if holder.get("host") != socket.gethostname():
        return "on another host"
    if "boot_id" not in holder or "pid_namespace" not in holder:
        return OLD_FORMAT
    context = _machine_context()
    if holder["boot_id"] != context["boot_id"]:
        return f"under another boot id ({shown(holder['boot_id'], False)}: another machine with this hostname, or before a reboot)"
    if holder["pid_namespace"] != context["pid_namespace"]:
        return (
            f"in another PID namespace ({shown(holder['pid_namespace'], False)}, this one {context['pid_namespace']}: another "
            "container sharing this hostname)"
        )
    return None


def _machine_context() -> dict:
    """What, besides the host, makes a PID name one process: the boot (``/proc/sys/kernel/random/boot_id``) and the
    PID namespace (``/proc/self/ns/pid``). None where this system does not tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot_id = file.read().strip() or None
    except OSError:
        boot_id = None
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = None
    return {"boot_id": boot_id, "pid_namespace": namespace}


def _pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as file:
            return int(file.read())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def _slurm_job() -> dict:
    """The SLURM job and its restart count, if this runs in one: a requeued job keeps its id and counts up."""
    if "SLURM_JOB_ID" not in os.environ:
        return {}
    return {
        "slurm_job_id": os.environ["SLURM_JOB_ID"],
        "slurm_restart_count": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    }


def _pid_runs(pid: int, recorded_start: int | None) -> bool:
    """Whether process ``pid`` of this PID namespace runs and is the one that started at ``recorded_start``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user
    current = _process_start(pid)
    return recorded_start is None or current is None or recorded_start == current  # else: the PID was reused


def _remove_stale(path: str, stale_text: str) -> None:
    """Remove the lock file if it still holds ``stale_text``, under the break file."""
    breaker = path + BREAK_SUFFIX
    try:
        fd = os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        if _age(breaker) > STALE_BREAK_S:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(breaker)
        time.sleep(0.1)
        return
    os.close(fd)
    try:
        if _read_text(path) == stale_text:
            os.unlink(path)
    finally:
        os.unlink(breaker)


def _process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc``, Linux), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return int(file.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _read_text(path: str) -> str | None:
    """The lock file's text; None when it is gone or is anything but a run's lock file (so never this run's)."""
    try:
        return read_regular_file(path, MAX_LOCK_BYTES).decode(errors="replace")
    except (FileNotFoundError, UntrustedFileError):
        return None


def _read_lock(path: str) -> str | None:
    """The lock file's text (None if it is gone); anything at ``path`` but a regular file under `MAX_LOCK_BYTES` is
    refused by name, never followed (a symlink, dangling or not), waited on (a FIFO) or read whole."""
    try:
        return read_regular_file(path, MAX_LOCK_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return None
    except UntrustedFileError as exc:
        raise OutputDirLocked(
            f"{exc} It is not a run's lock file: the lock cannot be taken. Remove it (it is not this library's), "
            "then start the run again."
        ) from None


def _parse(text: str | None) -> dict | None:
    """The lock's holder record, or None for anything else: damaged, deeply nested (never parsed), not an object."""
    data = (text or "").encode(errors="replace")
    if nesting_depth(data, MAX_NESTING) > MAX_NESTING:
        return None
    try:
        holder = json.loads(text or "")
    except (ValueError, RecursionError):
        return None
    return holder if isinstance(holder, dict) else None


def _age(path: str) -> float:
    """Seconds since ``path`` was last written, by the clock of the filesystem that holds it: measured against a file
    this run writes now in the same directory, so a network filesystem's server clock, however skewed from this
    host's, stamps both. 0.0 when ``path`` is gone or the directory takes no new file (then nothing counts as old)."""
    probe = f"{path}.now-{os.getpid()}-{threading.get_ident()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return 0.0
    try:
        os.write(fd, b"now")
        now = os.fstat(fd).st_mtime
    except OSError:  # a full disk: nothing counts as old, and the probe is removed below
        return 0.0
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(probe)
    try:
        return now - os.lstat(path).st_mtime
    except FileNotFoundError:
        return 0.0
