"""Judge-side code (see `riskpo_trl.code.judge`): runs in processes of its own, never in the trainer.

`serve` is the judge server: a single-threaded process that has imported the judging modules once and forks one
judge per request. A request is a small header (CPU seconds, memory bytes, wall-clock milliseconds) with two file
descriptors: an unnamed file holding ``<TestSpec JSON>\\n<report bytes>``, and the write end of a pipe for the verdict,
``P`` (every test passed), ``F<reason>`` or ``U<reason>`` (could not judge: the machine's fault), each message framed by
its length. Each judge sets its own RLIMIT_CPU and RLIMIT_AS before reading anything; the server SIGKILLs it when its
wall-clock time is up and reaps it, and keeps the verdict pipe until then: when the judge ended without a verdict it
writes one for it, ``F`` when the judge overran its CPU or memory limit (the report's doing), ``U`` when it could not
fork one or the judge was killed at its wall-clock deadline with less than a tenth of it spent on a CPU (a starved
machine). The server itself never reads a report.

Standard library only (through this package's own modules).
"""

import os
import resource
import select
import signal
import socket
import sys
import time

from .fdwait import poll_ms

VERDICT_REASON_CHARS = 300
HEADER_BYTES = 64
LENGTH_BYTES = 2  # as riskpo_trl.code.judge.LENGTH_BYTES
STARVED_CPU_SHARE = 0.1  # a judge killed at its deadline with less CPU than this share of it was starved


def _limit(kind: int, value: int) -> None:
    resource.setrlimit(kind, (value, value))


def _decide(data: bytes) -> bytes:
    from .report import parse_report
    from .testspec import TestSpec

    try:
        newline = data.find(b"\n")
        spec = TestSpec.from_json(data[:newline].decode("utf-8", errors="surrogatepass"))
        outputs, error = parse_report(data[newline + 1 :], len(spec.inputs), spec.output_caps())
        if error is not None:
            return _fail(error)
        failed = spec.first_failure(outputs)
        return b"P" if failed is None else _fail(f"test {failed} failed")
    except MemoryError:
        return _fail("judge: out of memory")
    except Exception as exc:  # noqa: BLE001 - whatever the report makes the judge do fails the completion
        return _fail(f"judge: {type(exc).__name__}: {exc}")


def _fail(reason: str, kind: bytes = b"F") -> bytes:
    return kind + reason[:VERDICT_REASON_CHARS].encode("utf-8", errors="replace")


def _send(fd: int, message: bytes) -> None:
    """One framed message in one write (at most a few hundred bytes: atomic on a pipe); never raises."""
    try:
        os.write(fd, len(message).to_bytes(LENGTH_BYTES, "big") + message)
    except OSError:
        pass


def _judge(payload_fd: int, verdict_fd: int, cpu_s: int, memory_bytes: int) -> None:
    """One judge (a forked child of the server): limits first, then read, decide, answer, exit."""
    _limit(resource.RLIMIT_CPU, cpu_s)
    _limit(resource.RLIMIT_AS, memory_bytes)
    _limit(resource.RLIMIT_CORE, 0)
    verdict = _fail("judge: could not read its input")
    try:
        with os.fdopen(payload_fd, "rb") as payload:
            payload.seek(0)
            data = payload.read()
        verdict = _decide(data)
    except BaseException:  # noqa: BLE001 - even MemoryError while reading: answer, then exit
        pass
    try:
        _send(verdict_fd, verdict)
    finally:
        os._exit(0)


def serve(sock_fd: int) -> None:
    """The judge server's loop (until the trainer closes its end of the socket)."""
    from . import assertions, report, testspec  # noqa: F401 - imported once here, so every forked judge has them

    assertions._prelude_names()  # the stdlib modules the runner's prelude imports, also loaded once

    channel = socket.socket(fileno=sock_fd)
    # A judge's exit wakes the loop (SIGCHLD through a self-pipe), so it is reaped at once, not left a zombie.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    judges: dict[int, tuple[float, float, int]] = {}  # judge pid -> (started, deadline, its verdict pipe)
    poller = select.poll()
    for fd in (channel.fileno(), wake_read):
        poller.register(fd, select.POLLIN)
    while True:
        now = time.monotonic()
        timeout = max(0.0, min(deadline for _, deadline, _ in judges.values()) - now) if judges else None
        ready = {fd for fd, _ in poller.poll(poll_ms(timeout))}
        if wake_read in ready:
            while True:
                try:
                    if not os.read(wake_read, 4096):
                        break
                except BlockingIOError:
                    break
        _reap(judges)
        if channel.fileno() not in ready:
            continue
        try:
            header, fds, _, _ = socket.recv_fds(channel, HEADER_BYTES, 2)
        except OSError:
            fds, header = [], b""
        if not header:  # the trainer is gone: its judges die by their deadlines, and the server goes now
            os._exit(0)
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        pid = None
        try:
            cpu_s, memory_bytes, timeout_ms = (int(part) for part in header.split())
            pid = os.fork()
        except ValueError:
            _send(fds[1], _fail("malformed request", b"U"))
        except OSError as exc:  # no process to be had: that judgement is unscorable, not failed
            _send(fds[1], _fail(f"cannot fork a judge: {exc.strerror}", b"U"))
        if pid == 0:
            channel.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_read)
            os.close(wake_write)
            for other in judges.values():
                os.close(other[2])
            _judge(fds[0], fds[1], cpu_s, memory_bytes)
        os.close(fds[0])
        if pid is None:
            os.close(fds[1])
        else:  # kept until the judge is reaped, to answer for it if it dies without a verdict
            os.set_blocking(fds[1], False)
            now = time.monotonic()
            judges[pid] = (now, now + timeout_ms / 1000, fds[1])


def _reap(judges: dict[int, tuple[float, float, int]]) -> None:
    """Reap finished judges and SIGKILL overdue ones (each still our unreaped child, so its pid is not reused); for a
    judge that ended without a verdict, write one on its pipe (`serve`), then close it."""
    now = time.monotonic()
    for pid, (started, deadline, verdict_fd) in list(judges.items()):
        killed = now >= deadline
        if killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            done, status, usage = os.wait4(pid, os.WNOHANG if not killed else 0)
        except ChildProcessError:
            done, status, usage = pid, 0, None
        if not done:
            continue
        del judges[pid]
        if status != 0:  # it wrote no verdict (or one that the trainer already took: a later message is ignored)
            cpu = usage.ru_utime + usage.ru_stime if usage is not None else 0.0
            if killed and cpu < STARVED_CPU_SHARE * (deadline - started):
                _send(verdict_fd, _fail(f"judge starved: {cpu:.1f} s of CPU in {deadline - started:g} s", b"U"))
            else:
                _send(verdict_fd, _fail(f"judge: no verdict within its time, CPU or memory limits ({cpu:.1f} s CPU)"))
        os.close(verdict_fd)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
