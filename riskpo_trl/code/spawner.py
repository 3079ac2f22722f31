"""Start bwrap, as root, inside the staging namespaces and as a worker slot's unprivileged uid: one vfork and one exec.

The trainer's own threads stay where they are. One dedicated thread per process leaves the process's shared
file-system context (``unshare(CLONE_FS)``), joins the staging server's mount and network namespaces (``setns``, which
acts on the calling thread only), and starts each bwrap from there. For the start it switches its own credentials to
the slot's uid and gid, with no supplementary groups, through the raw system calls (the C library's wrappers would
change every thread of the process), and back to root right after. The started process inherits the thread's
namespaces and credentials and execs bwrap as that uid: exactly what ``nsenter --mount --net --setuid --setgid`` did,
without starting nsenter (an exec and a dynamic link per run).

The thread exists only where this works: root, an architecture listed in `_CREDENTIAL_CALLS`, and a kernel that lets
the thread join the namespaces. `Spawner.start_error` says why it does not, and the caller then uses nsenter.
"""

from __future__ import annotations

import ctypes
import os
import platform
import subprocess
from concurrent.futures import ThreadPoolExecutor

CLONE_FS = 0x00000200
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4
# (setgroups, setresuid, setresgid) system call numbers
_CREDENTIAL_CALLS = {"x86_64": (116, 117, 119), "aarch64": (159, 147, 149)}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


class Spawner:
    """A thread in the namespaces of process ``namespace_pid`` that starts processes there as a given uid.

    Made by one process and used only by it (a forked process makes its own). Thread-safe: starts are serialized on
    the thread.
    """

    def __init__(self, namespace_pid: int):
        self.owner = os.getpid()
        self.start_error: str | None = None
        self._broken = False  # set if the thread could not return to root: it then starts nothing more
        calls = _CREDENTIAL_CALLS.get(platform.machine())
        if os.geteuid() != 0 or calls is None:
            self.start_error = f"needs root on one of {sorted(_CREDENTIAL_CALLS)}"
            self._executor = None
            return
        self._setgroups, self._setresuid, self._setresgid = calls
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sandbox-spawner")
        try:
            self._executor.submit(self._enter, namespace_pid).result()
        except OSError as exc:
            self.start_error = str(exc)
            self._executor.shutdown(wait=False)
            self._executor = None

    @property
    def usable(self) -> bool:
        return self._executor is not None and self.owner == os.getpid() and not self._broken

    def _enter(self, namespace_pid: int) -> None:
        _check(_libc.unshare(CLONE_FS), "unshare(CLONE_FS)")  # this thread's root and cwd become its own
        for name, kind in (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET)):
            fd = os.open(f"/proc/{namespace_pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _check(_libc.setns(fd, kind), f"setns({name})")
            finally:
                os.close(fd)
        self._groups = os.getgroups()

    def popen(self, uid: int, command: list[str], **popen_kwargs) -> subprocess.Popen:
        """`subprocess.Popen` of ``command`` in the namespaces, as ``uid`` (and gid ``uid``, no groups)."""
        return self._executor.submit(self._popen_as, uid, command, popen_kwargs).result()

    def _popen_as(self, uid: int, command: list[str], popen_kwargs: dict) -> subprocess.Popen:
        if self._broken:
            raise OSError("the sandbox spawner thread could not return to root earlier")
        # the saved ids stay 0, so that this thread can return to root; exec makes them the new uid in the child
        dumpable = _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
        try:
            _check(_libc.syscall(self._setgroups, 0, None), "setgroups")
            _check(_libc.syscall(self._setresgid, uid, uid, 0), "setresgid")
            _check(_libc.syscall(self._setresuid, uid, uid, 0), "setresuid")
            return subprocess.Popen(command, **popen_kwargs)
        finally:
            self._become_root(dumpable)

    def _become_root(self, dumpable: int) -> None:
        groups = (ctypes.c_uint * max(1, len(self._groups)))(*self._groups)
        try:  # in this order: only root may set the group ids and groups
            _check(_libc.syscall(self._setresuid, 0, 0, 0), "setresuid")
            _check(_libc.syscall(self._setresgid, 0, 0, 0), "setresgid")
            _check(_libc.syscall(self._setgroups, len(self._groups), groups), "setgroups")
            # changing the effective ids made the whole process non-dumpable (no core dumps): undo that
            _check(_libc.prctl(PR_SET_DUMPABLE, dumpable, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")
        except OSError:
            self._broken = True
            raise

    def close(self) -> None:
        if self._executor is not None and self.owner == os.getpid():
            self._executor.shutdown(wait=False)
            self._executor = None
