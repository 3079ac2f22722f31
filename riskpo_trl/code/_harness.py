"""Child-side test runner of the code sandbox. Runs as ``python -I -S -B -c <this source>`` inside the sandbox.

Standard library only. It reads the spec (program, test inputs, limits) from stdin, lowers its own resource limits,
installs an audit hook that refuses networking, process execution, ctypes, signals to other processes, tracers and
writes outside the working directory and /dev/shm, then runs the program once per test and writes its report of
*observed* values to the stdout it was started with (a pipe the parent reads with a size cap): a start mark (``S0\n``)
once the program is compiled, then one length-prefixed record per test output (``O<length>\n<bytes>``), each written
as soon as its test ends, an optional error (``E...``) and an end mark (``D0\n``).

There is no timer in here: the per-test deadline is the trainer's (`riskpo_trl.code.sandbox`). It reads the records
as they arrive and kills the whole sandbox (its PID namespace) when a test's record is not complete within
``test_timeout_s`` of the record before it (of the start mark, for the first test). So nothing the program does with
signals or exceptions in here extends it.

Nothing here decides whether a test passed, because the program runs in this interpreter and can rewrite all of it
(this module, its report, the builtins). Expected outputs never enter this process: a judge process outside the
sandbox compares outputs (`riskpo_trl.code.judge`), and assert-style check code arrives instrumented
(`riskpo_trl.code.assertions`): each assertion only records the values of its sub-expressions that call into the
program (as JSON of builtin values), and the judge evaluates the rest, expected values included, which never enter the
sandbox. So a program that tampers with this runner can at worst report values it could have printed or returned
anyway.

The audit hook is defence in depth, not a security boundary (CPython documents that, and a program can rewrite its
tables): the boundary is the bubblewrap sandbox the parent starts this runner in (`riskpo_trl.code.bwrap`).
"""

import builtins
import json
import os
import resource
import signal
import sys
import types

# Taken before any program runs: a program that replaces builtins.exec must not turn the check code into a no-op.
_exec, _compile = builtins.exec, builtins.compile
_BUILTINS = dict(vars(builtins))  # each test gets a fresh copy, so one test's program cannot rewire the next test's
PROBE_NAME = "__riskpo_probe__"  # what instrumented assert code calls (see riskpo_trl.code.assertions)

# os.fork is allowed (multiprocessing.Pool): the pids cgroup or RLIMIT_NPROC bounds it; executing programs is not.
# os.kill is allowed for the runner's own children only (Pool.terminate), see `_own_child`.
_DENIED_EVENTS = frozenset(
    {
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.getaddrinfo",
        "os.forkpty",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "subprocess.Popen",
        "os.killpg",
        "signal.pthread_kill",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.call_function",
        "sys.remote_exec",
        "os.setuid",
        "webbrowser.open",
        # tracers and further hooks could watch or rewrite the test code's evaluation
        "sys.settrace",
        "sys.setprofile",
        "sys.addaudithook",
    }
)
# Events that change the file named by their path argument(s): allowed inside the sandbox directory only. Paths given
# as file descriptors are refused; paths relative to a directory fd (``dir_fd``) are resolved through /proc/self/fd.
_PATH_ARGS = {  # event -> how many leading arguments are paths
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.utime": 1,
    "os.truncate": 1,
    "os.link": 2,
    "os.symlink": 2,
    "os.rename": 2,
    "shutil.copyfile": 2,
    "shutil.copymode": 2,
    "shutil.copystat": 2,
    "shutil.copytree": 2,
    "shutil.rmtree": 1,
    "shutil.move": 2,
    "shutil.make_archive": 1,
    "shutil.chown": 1,
}
# The trailing dir_fd arguments of those events (os.remove(path, dir_fd), os.rename(src, dst, src_dir_fd, ...)).
_DIR_FD_ARGS = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.utime": 1,
    "os.link": 2,
    "os.symlink": 1,
    "os.rename": 2,
    "shutil.rmtree": 1,
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_DIR_FLAGS = os.O_DIRECTORY | getattr(os, "O_PATH", 0)


def _set_limits(spec):
    def lower(kind, value):
        soft, hard = resource.getrlimit(kind)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))

    lower(resource.RLIMIT_CPU, int(spec["cpu_time_s"]))
    lower(resource.RLIMIT_AS, int(spec["memory_mb"]) * 1024 * 1024)
    lower(resource.RLIMIT_FSIZE, int(spec["max_output_bytes"]))
    lower(resource.RLIMIT_NOFILE, int(spec["max_open_files"]))
    lower(resource.RLIMIT_CORE, 0)
    # Only without a pids cgroup, which bounds the whole program; the kernel does not enforce RLIMIT_NPROC for root
    # (the runner is root only with isolation="none").
    if spec.get("nproc_rlimit", True) and os.getuid() != 0:
        lower(resource.RLIMIT_NPROC, _tasks_of_uid(os.getuid()) + int(spec["max_processes"]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized output: EFBIG error, not a silent death


def _tasks_of_uid(uid):
    """Threads of all processes of ``uid``: RLIMIT_NPROC counts these, so the cap is relative to them."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{name}/task"))
            except OSError:
                pass
    return count


def _install_guard(root, shared_memory_dir=None):
    roots = [os.path.realpath(root)] + ([shared_memory_dir] if shared_memory_dir else [])
    # Our own /proc entry: our pid, or in a PID namespace without its own /proc mount, the pid /proc/self names.
    own_pids = {str(os.getpid()), os.readlink("/proc/self")}
    realpath, join, getcwd, fspath, isdir = os.path.realpath, os.path.join, os.getcwd, os.fspath, os.path.isdir

    def resolve(path, dir_fd=None):
        path = fspath(path)
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        # Python 3.11 reports an unset dir_fd as -1 (later versions as None); a set one is resolved through /proc
        base = getcwd() if dir_fd is None or dir_fd == -1 else os.readlink(f"/proc/self/fd/{int(dir_fd)}")
        return realpath(join(base, path))

    def inside(path):
        return any(path == root or path.startswith(root + os.sep) for root in roots)

    def hook(event, args):
        if event in _DENIED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "os.kill" and not _own_child(args[0]):
            raise PermissionError("sandbox: os.kill of a process other than the program's own child is not allowed")
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            full = resolve(path)
            parts = full.split("/")
            if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] not in own_pids:
                raise PermissionError(f"sandbox: reading {full} is not allowed")  # others' environ, cmdline, memory
            if inside(full) or full == "/dev/null":
                return
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writes:
                raise PermissionError(f"sandbox: writing {full} is not allowed")
            # An outside directory's fd would let dir_fd= calls (whose "open" event does not report dir_fd) write there.
            if (flags or 0) & _DIR_FLAGS or isdir(full):
                raise PermissionError(f"sandbox: opening the directory {full} is not allowed")
        elif event in _PATH_ARGS:
            n_paths, n_dir_fds = _PATH_ARGS[event], _DIR_FD_ARGS.get(event, 0)
            dir_fds = list(args[len(args) - n_dir_fds :]) if n_dir_fds else []
            dir_fds = [None] * (n_paths - len(dir_fds)) + dir_fds  # os.symlink: one dir_fd, for the link itself
            for arg, dir_fd in zip(args[:n_paths], dir_fds):
                if isinstance(arg, int) or not isinstance(dir_fd, (int, type(None))):
                    raise PermissionError(f"sandbox: {event} on {arg!r} is not allowed")
                try:
                    full = resolve(arg, dir_fd) if isinstance(arg, (str, bytes, os.PathLike)) else None
                except (OSError, ValueError):
                    full = ""
                if full is not None and not inside(full):
                    raise PermissionError(f"sandbox: {event} on {arg!r} is not allowed")

    sys.addaudithook(hook)
    _guard_unaudited(inside, resolve)


def _own_child(pid):
    """Whether ``pid`` is a child of this process (waitid without reaping: opening /proc here would be audited)."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (OSError, ValueError, OverflowError, TypeError):
        return False
    return pid > 0


def _guard_unaudited(inside, resolve):
    """Replace os.mkfifo and os.mknod, which raise no audit event, with checked versions.

    mknod is refused outright: as root it makes device nodes, which would turn an allowed write inside the sandbox
    directory into a write to a disk. mkfifo is allowed inside the directory, without ``dir_fd``.
    """
    import posix

    real_mkfifo = posix.mkfifo

    def mkfifo(path, mode=0o666, *, dir_fd=None):
        if dir_fd is not None or isinstance(path, int) or not inside(resolve(path)):
            raise PermissionError(f"sandbox: os.mkfifo on {path!r} is not allowed")
        return real_mkfifo(path, mode)

    def mknod(path, mode=0o600, device=0, *, dir_fd=None):
        raise PermissionError("sandbox: os.mknod is not allowed")

    for module in (os, posix):
        module.mkfifo, module.mknod = mkfifo, mknod


def _redirect(fd, path, flags):
    new = os.open(path, flags, 0o600)
    if new != fd:  # the program may have closed ``fd`` (e.g. a collected ``open(0)``), so os.open reused it
        os.dup2(new, fd)
        os.close(new)


class _Quitter:
    """``exit()`` and ``quit()`` as ``site`` defines them (the runner starts with ``-S``, so they are missing)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


_BUILTINS.update(exit=_Quitter("exit"), quit=_Quitter("quit"))

# Names competitive-programming and LeetCode solutions use without importing them (as LiveCodeBench's runner does).
_PRELUDE = (
    "import bisect, collections, functools, heapq, itertools, math, random, re, string, sys\n"
    "from bisect import *\nfrom collections import *\nfrom functools import *\nfrom heapq import *\n"
    "from itertools import *\nfrom math import *\nfrom typing import *\n"
)


def _program_module(name):
    """A fresh module for one test's program, registered in ``sys.modules`` under its ``__name__`` so that pickling
    its functions by name works (``multiprocessing.Pool``); fresh builtins, so one test cannot rewire the next."""
    module = types.ModuleType(name)
    module.__builtins__ = dict(_BUILTINS)
    sys.modules[name] = module
    return module


def _run_one(code, style, fn_name, test_input, workdir):
    """Run one test; return (observed output, error or None).

    style "stdin": the program reads ``test_input`` on stdin, its stdout is the output. "functional": the program
    defines ``fn_name`` (or a ``Solution`` method), called with the JSON lines of ``test_input``; the JSON of the return
    value is the output. "assert": ``test_input`` is test code run after the program; reaching its end is the pass.
    """
    in_path, out_path = join_(workdir, "stdin.txt"), join_(workdir, "stdout.txt")
    with open(in_path, "w") as f:
        f.write(test_input if style == "stdin" else "")
    _redirect(0, in_path, os.O_RDONLY)
    _redirect(1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    result, error, records = None, None, []
    try:
        namespace = _program_module("__main__" if style == "stdin" else "solution").__dict__
        _exec(_PRELUDE, namespace)
        _exec(code, namespace)
        if style == "assert":
            namespace[PROBE_NAME] = lambda index, leaves: records.append([index, [_observe(leaf) for leaf in leaves]])
            _exec(_compile(test_input, "<tests>", "exec"), namespace)
        elif style == "functional":
            target = namespace.get("Solution")
            func = getattr(target(), fn_name) if isinstance(target, type) else namespace.get(fn_name)
            if not callable(func):
                raise NameError(f"no function or Solution method named {fn_name!r}")
            args = [json.loads(line) for line in test_input.split("\n") if line.strip()]
            result = func(*args)
    except SystemExit as exc:  # a clean exit ends a stdin program; elsewhere it would skip the function or the check
        if style != "stdin" or exc.code not in (None, 0):
            error = f"SystemExit({exc.code!r})"
    except BaseException as exc:  # noqa: BLE001 - any failure of the program fails the test
        error = f"{type(exc).__name__}: {exc}"[:500]
    try:
        sys.stdout.flush()
    except BaseException as exc:  # noqa: BLE001 - e.g. output over RLIMIT_FSIZE
        error = error or f"{type(exc).__name__}: {exc}"[:500]
    if error is not None:
        return None, error
    try:
        if style == "assert":
            return _dumps(records), None
        if style == "functional":
            return _dumps(encode_value(result)), None
    except (TypeError, ValueError, RecursionError) as exc:
        return None, f"unserialisable value: {exc}"[:500]
    with open(out_path, "rb") as f:
        return f.read().decode("utf-8", errors="replace"), None


join_ = os.path.join


MAX_DEPTH = 100  # nesting of a reported value; the parent refuses deeper JSON
_TAGS = ("__set__", "__dict__", "__bytes__", "__object__", "__raised__")


def _dumps(value):
    return json.dumps(value, ensure_ascii=False)


def encode_value(value, depth=0):
    """A JSON-able copy of ``value``, read through the builtin types' own methods.

    Subclasses (``Counter``, ``defaultdict``, a ``namedtuple``, an ``IntEnum``) become their builtin base, read with
    the base's methods, so their own ``__eq__``/``__iter__``/``__repr__`` never decide anything. Tuples become lists;
    sets ``{"__set__": items}``; dicts with a key that is not a str ``{"__dict__": [[key, value], ...]}``; bytes
    ``{"__bytes__": latin-1 text}``; anything else ``{"__object__": type name}`` (equal to nothing, but not None).
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"a value nested deeper than {MAX_DEPTH}")
    depth += 1
    if value is None or value is True or value is False:
        return value
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(
            bytes.__getitem__(value, slice(None))
            if isinstance(value, bytes)
            else bytearray.__getitem__(value, slice(None))
        )
        return {"__bytes__": raw.decode("latin-1")}
    if isinstance(value, (list, tuple)):
        iterate = list.__iter__ if isinstance(value, list) else tuple.__iter__
        return [encode_value(item, depth) for item in iterate(value)]
    if isinstance(value, (set, frozenset)):
        iterate = set.__iter__ if isinstance(value, set) else frozenset.__iter__
        return {"__set__": [encode_value(item, depth) for item in iterate(value)]}
    if isinstance(value, dict):
        pairs = [(encode_value(key, depth), encode_value(item, depth)) for key, item in dict.items(value)]
        if all(type(key) is str for key, _ in pairs) and not (len(pairs) == 1 and pairs[0][0] in _TAGS):
            return dict(pairs)
        return {"__dict__": [list(pair) for pair in pairs]}
    return {"__object__": type(value).__name__[:100]}


def _observe(leaf):
    """The encoded value of one assertion sub-expression (a thunk), or which exception it raised: the parent decides
    whether that matters (Python would not have evaluated a sub-expression that ``or``/``and`` skip)."""
    try:
        return encode_value(leaf())
    except Exception as exc:  # noqa: BLE001 - exit and interrupts still end the test
        return {"__raised__": type(exc).__name__[:100]}


def main():
    # Python's 4,300-digit int/str conversion limit guards servers against slow conversions; here the program's own
    # CPU limit does, and big-number problems need integers beyond it (in the input, printed, or returned).
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    with open(0, "rb", closefd=False) as f:
        spec = json.loads(f.read())
    report = os.fdopen(os.dup(1), "wb")  # the parent reads this; the program's stdout goes to a per-test file
    os.closerange(3, report.fileno())  # nothing else of the parent's reaches the program
    os.closerange(report.fileno() + 1, 1 << 16)
    workdir = os.getcwd()
    _set_limits(spec)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    if spec.get("audit_guard", True):
        _install_guard(workdir, spec.get("shared_memory_dir"))
    error = None
    try:
        code = _compile(spec["source"], "<solution>", "exec")
    except (SyntaxError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    else:
        _record(report, b"S", b"")  # the trainer starts the first test's clock here
        report.flush()
        for test_input in spec["inputs"]:
            try:
                output, error = _run_one(code, spec["style"], spec["fn_name"], test_input, workdir)
            except BaseException as exc:  # noqa: BLE001 - the program broke the runner's own plumbing
                output, error = None, f"runner: {type(exc).__name__}: {exc}"[:500]
            if error is not None:
                break  # a failed test fails the program; stop early
            _record(report, b"O", output.encode("utf-8", errors="surrogatepass"))
            report.flush()  # the trainer starts the next test's clock when this record is complete
    if error is not None:
        _record(report, b"E", error.encode("utf-8", errors="replace"))
    _record(report, b"D", b"")
    report.flush()
    os._exit(0)  # skip interpreter teardown, which the program may have booby-trapped (atexit, __del__)


def _record(stream, kind, payload):
    stream.write(kind + str(len(payload)).encode() + b"\n" + payload)


if __name__ == "__main__":
    main()
