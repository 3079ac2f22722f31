"""Stop a training run cleanly on SIGINT (Ctrl-C), SIGTERM (a cluster's preemption) or SIGUSR1 (SLURM's early
warning, ``--signal=B:USR1@<seconds>``), so that the same command resumes it exactly.

TRL generates once per generation batch and trains several optimizer steps on it; a checkpoint inside a batch resumes
with a freshly generated batch, not the one the uninterrupted run trained on. So a signal only sets a flag, and the
run stops at the end of the current generation batch (at most ``period - 1`` more optimizer steps, without generating
again), saves a checkpoint there, prints one line and exits with :data:`STOPPED_EXIT_CODE`. The processes of a
distributed run agree on the flag with one tiny all-reduce per generation batch, so all of them stop at the same step
even when the signal reached only some of them.

A vLLM server that does not answer within its timeout (``ServerTimeoutError`` of ``riskpo_trl.weight_sync``: a hang
while generating or syncing), or that refused or dropped the connection (``ServerUnreachableError``: it died), stops
the run the same way, at once: the error ends ``trainer.train()`` at the generation-batch boundary where the trainer
generates, the trainer saves a checkpoint of the last completed step (none at step 0), prints the error and the stop
line, and exits with :data:`STOPPED_EXIT_CODE`. In a multi-process run every process raises the main process's error
at the same point (``riskpo_trl.weight_sync.agreement``), so all of them save the checkpoint together and each prints
one line.

A signal that arrives while the main thread waits on the server (``interruptible_wait``: a generation, a sync's
request or transfer) does not wait for the end of the batch: the wait is abandoned (``StopRequested``) and the run
stops at once, as after a server timeout, with a checkpoint of its last completed step.

A second Ctrl-C more than :data:`REPEAT_WINDOW_S` after the first aborts at once: the process kills itself with
SIGINT (exit status 130) without saving, and ``output_dir`` keeps its earlier checkpoints. A watchdog thread reads
every signal as it arrives (``signal.set_wakeup_fd``), so this holds while the main thread is blocked inside a
library (a collective waiting for another process). A repeat within the window counts as the same request (SLURM
signals every process of a job step, and the launcher of ``accelerate launch`` passes the signal on once more); a
repeated SIGTERM or SIGUSR1 is ignored, as the stop is under way. Once the stop's checkpoint is saved, a signal no
longer aborts: the process exits with :data:`STOPPED_EXIT_CODE` within :data:`EXIT_GRACE_S` of it, whatever still
runs, and so does the training script's own process after its stop line (`exit_within`; the script ends it at once
when its run lock is released, `end_process_after_stop`).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler  # imported here: the stop path takes no import lock
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from transformers import TrainerCallback

from .last_checkpoint import CHECKPOINT_COMPLETE_MARKER
from .last_checkpoint import last_complete_checkpoint as last_complete_checkpoint  # resuming is part of stopping

# EX_TEMPFAIL of sysexits.h, "temporary failure, try again later": the run stopped at a checkpoint and the same
# command resumes it. Distinct from a crash (1), a usage error (2) and a death by signal (128 + N).
STOPPED_EXIT_CODE = 75
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGUSR1")
# A repeated Ctrl-C within this many seconds is the same request, not an abort.
REPEAT_WINDOW_S = 1.0
# If set, the stop line is also written to this file by each node's first process: a launcher (torchrun, under
# `accelerate launch`) reports a process's exit code 75 as a failure and exits 1, so a wrapper script reads this file.
STOP_FILE_ENV = "RISKPO_STOP_FILE"
# Once a stop's checkpoint is written, the process exits within this many seconds of its stop line, or of a signal.
EXIT_GRACE_S = 5.0


class RunStopped(SystemExit):
    """Raised by the training script after a clean stop: uncaught, the process exits with :data:`STOPPED_EXIT_CODE`
    and no traceback."""

    def __init__(self, step: int, checkpoint: str, signal_name: str, end_process=None):
        super().__init__(STOPPED_EXIT_CODE)
        self.step, self.checkpoint, self.signal_name = step, checkpoint, signal_name
        # For the training script's own process: call once the run lock is released (`end_process_after_stop`).
        self.end_process = end_process


def generation_period(args) -> int:
    """Optimizer steps between two generation batches of a GRPO-family config: TRL generates every
    ``steps_per_generation * num_iterations`` micro-steps, and an optimizer step takes ``gradient_accumulation_steps``
    of them. 1 for a config without generation batches."""
    every = getattr(args, "steps_per_generation", None)
    if not every:
        return 1
    every *= getattr(args, "num_iterations", 1)
    return every // math.gcd(every, args.gradient_accumulation_steps)


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") == "0"


class StopOnSignal(TrainerCallback):
    """Turns a stop signal into a checkpoint at the next generation-batch boundary and the end of training.

    Use :func:`stopping_on_signals`, which installs the handlers for the duration of ``trainer.train()`` (they can only
    be installed from the main thread). After training, ``stopped_at`` is the step the run stopped at for a signal, or
    None (no signal, or it came during the run's last step: then the run simply finished)."""

    def __init__(self, period: int):
        self.period = period
        self.requested: int | None = None  # the signal this process received
        self.stopped_at: int | None = None
        self.signal_name: str | None = None  # of the signal the processes agreed on, or what else stopped the run
        self.cause: str | None = None  # the error that stopped the run, for one that is no signal
        self._requested_at = 0.0
        self._previous: dict[int, object] = {}
        self._first_step = 0  # TRL generates at the first step of train(), also on resume
        self.checkpoint_saved = False  # the stop's checkpoint is written: the run exits with STOPPED_EXIT_CODE
        # The process is the training script's own: it ends within EXIT_GRACE_S of its stop line, whatever thread or
        # request a library left running (an abandoned request's thread would be joined at exit).
        self.exit_after_stop = False

    def install(self) -> None:
        from ..weight_sync.bounded import forget_stop_signal

        forget_stop_signal()
        if self.exit_after_stop:
            start_exit_timer()
        for name in STOP_SIGNALS:
            number = getattr(signal, name, None)  # Windows has no SIGUSR1
            if number is not None:
                self._previous[number] = signal.signal(number, self._handle)
        self._watch_signals()

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._wakeup[0])
            for fd in self._wakeup[1:]:
                os.close(fd)  # the watchdog's read fails and it ends
            self._wakeup = None

    _wakeup: tuple[int, int, int] | None = None  # (the previous wakeup fd, our reading end, our writing end)

    def _watch_signals(self) -> None:
        """Every signal also reaches a watchdog thread at once (through the wakeup fd), which aborts on a second
        Ctrl-C and ends a saved stop, while the main thread may be blocked inside a library."""
        reading, writing = os.pipe()
        os.set_blocking(writing, False)
        try:
            previous = signal.set_wakeup_fd(writing, warn_on_full_buffer=False)
        except ValueError:  # not the main thread
            os.close(reading)
            os.close(writing)
            return
        self._wakeup = (previous, reading, writing)
        threading.Thread(target=self._watch, args=(reading,), name="riskpo-stop-signals", daemon=True).start()

    def _watch(self, reading: int) -> None:
        first_at = None
        while True:
            try:
                numbers = os.read(reading, 64)
            except OSError:
                return
            if not numbers:
                return
            for number in numbers:
                if number not in self._previous:  # the wakeup fd carries every handled signal (SIGALRM, ...)
                    continue
                if self.checkpoint_saved:
                    exit_within(EXIT_GRACE_S, STOPPED_EXIT_CODE)
                elif first_at is None:
                    first_at = time.monotonic()
                elif number == signal.SIGINT and time.monotonic() - first_at > REPEAT_WINDOW_S:
                    abort_with_sigint()

    def _handle(self, number: int, frame) -> None:
        """The first stop signal: asks for the stop, and ends a wait on the server at once (`interrupt_wait`);
        repeats change nothing here (the watchdog aborts on a second Ctrl-C)."""
        if self.checkpoint_saved or self.requested is not None:
            return
        self.requested, self._requested_at = number, time.monotonic()
        if _is_main_process():
            when = (
                "after the current optimizer step"
                if self.period == 1
                else f"at the end of the current generation batch (at most {self.period - 1} more optimizer "
                f"step{'s' if self.period > 2 else ''})"
            )
            abort = "; press Ctrl-C again to abort without saving" if number == signal.SIGINT else ""
            self._say(f"{signal.Signals(number).name} received: stopping {when} and saving a checkpoint there{abort}.")
        from ..weight_sync.bounded import interrupt_wait

        interrupt_wait(signal.Signals(number).name)  # raises StopRequested while waiting on the server

    @staticmethod
    def _say(message: str) -> None:
        os.write(2, f"\n{message}\n".encode())  # not print: the handler may interrupt a print in progress

    def _agreed_signal(self, args) -> int:
        """The largest signal number any process received (0: none), the same on every process."""
        import torch
        import torch.distributed as dist

        number = self.requested or 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([number], dtype=torch.int64, device=args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            number = int(flag.item())
        return number

    def on_train_begin(self, args, state, control, **kwargs):
        self._first_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if (state.global_step - self._first_step) % self.period:  # inside a generation batch
            return
        number = self._agreed_signal(args)  # every process reaches every boundary: the collective matches
        if number and state.global_step < state.max_steps:
            self.stopped_at, self.signal_name = state.global_step, signal.Signals(number).name
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopped_at is not None and state.global_step == self.stopped_at:
            self.checkpoint_saved = True

    def checkpoint(self, args) -> str:
        return os.path.join(args.output_dir, f"checkpoint-{self.stopped_at}")

    def stop_for_server(self, trainer, error: BaseException) -> None:
        """After ``error`` (a server timeout, a server that stopped answering, or a stop signal that cut a wait on
        the server short) ended ``trainer.train()``: a checkpoint of the last completed step, kept if one was saved
        already; `finish` then prints ``error`` and the stop line."""
        from ..weight_sync.bounded import StopRequested

        self.stopped_at = trainer.state.global_step
        if isinstance(error, StopRequested):
            self.signal_name, self.cause = error.signal_name, None
        else:
            self.signal_name, self.cause = type(error).stop_reason, str(error)
        checkpoint = self.checkpoint(trainer.args)
        if self.stopped_at and not os.path.isfile(os.path.join(checkpoint, CHECKPOINT_COMPLETE_MARKER)):
            trainer._save_checkpoint(trainer.model, trial=None)
        self.checkpoint_saved = True  # nothing is left to abort: signals are ignored until the exit with 75

    def finish(self, trainer) -> None:
        """After a stop: remove a model card that checkpoint saves left without a model, print the one line (and write
        it to ``$RISKPO_STOP_FILE``), release the process group, and raise :class:`RunStopped`."""
        args = trainer.args
        checkpoint = self.checkpoint(args)
        # Every process has finished writing its part of the checkpoint before any exits: a launcher that sees one
        # process end tears down the others, which must not happen mid-save.
        trainer.accelerator.wait_for_everyone()
        if args.should_save:
            remove_card_without_model(args.output_dir)
        saved = f"saved {checkpoint}" if self.stopped_at else "no step to save yet"
        line = (
            f"Stopped by {self.signal_name} at step {self.stopped_at} of {trainer.state.max_steps}: {saved}. Run the "
            f"same command to resume (exit code {STOPPED_EXIT_CODE})."
        )
        accelerator = trainer.accelerator
        if self.exit_after_stop:
            # Armed before the line: whatever holds the process after it (a lock, a collective, a destructor), it ends
            # EXIT_GRACE_S after the line (EXIT_BACKSTOP_S later where no Python thread can run).
            exit_within(EXIT_GRACE_S, STOPPED_EXIT_CODE)
        if self.cause:
            accelerator.print(self.cause)
        accelerator.print(line)
        if not getattr(accelerator, "is_main_process", True):  # one line from every process
            print(
                f"Process {accelerator.process_index} of {accelerator.num_processes}: stopped with the main process "
                f"at step {self.stopped_at} (exit code {STOPPED_EXIT_CODE}).",
                flush=True,
            )
        stop_file = os.environ.get(STOP_FILE_ENV)
        if stop_file and trainer.accelerator.is_local_main_process:
            with open(stop_file, "w") as file:
                file.write(line + "\n")
        with contextlib.suppress(Exception):  # the lines are out even if the native timer ends the process
            sys.stdout.flush()
        if not self.exit_after_stop:  # the process is the caller's (a notebook, a test): it gets its own handlers back
            self.restore()
        trainer.accelerator.end_training()  # what transformers' Trainer.end does (it exists only from 5.18)
        end_process = end_process_after_stop if self.exit_after_stop else None
        raise RunStopped(self.stopped_at, checkpoint, self.signal_name, end_process)


def remove_card_without_model(output_dir: str) -> bool:
    """TRL writes the model card into ``output_dir`` at every checkpoint; without a model next to it (a run stopped
    before its end) it describes a model that is not there, so remove it. True if it did."""
    card = os.path.join(output_dir, "README.md")
    has_model = any(os.path.isfile(os.path.join(output_dir, name)) for name in ("config.json", "adapter_config.json"))
    if os.path.isfile(card) and not has_model:
        os.remove(card)
        return True
    return False


@contextlib.contextmanager
def stopping_on_signals(trainer, exit_after_stop: bool = False) -> Iterator[StopOnSignal]:
    """Within the block (around ``trainer.train()``), SIGINT, SIGTERM and SIGUSR1 stop the run at the next
    generation-batch boundary with a checkpoint, and a server timeout at once (module docstring); the previous
    handlers come back after it, unless the stop saved its checkpoint: then signals stay ignored while
    :meth:`StopOnSignal.finish` ends the process with exit code 75 (``exit_after_stop``: within
    :data:`EXIT_GRACE_S` of its stop line, whatever still runs; for a process of its own, not a test's). Outside the main thread (where handlers cannot be
    installed) signals keep their usual effect."""
    stop = StopOnSignal(generation_period(trainer.args))
    stop.exit_after_stop = exit_after_stop
    trainer.add_callback(stop)
    with contextlib.suppress(ValueError):  # not the main thread
        stop.install()
    from ..weight_sync.bounded import ServerTimeoutError, StopRequested

    try:
        yield stop
    except (ServerTimeoutError, StopRequested) as error:
        stop.stop_for_server(trainer, error)
    finally:
        if not stop.checkpoint_saved:  # else the handlers stay, ignoring signals, until finish() exits with 75
            stop.restore()
        trainer.remove_callback(stop)


def abort_with_sigint() -> None:
    """The second Ctrl-C, from the watchdog thread: die of SIGINT (exit status 130) at once, without saving."""
    os.write(2, b"\nSecond Ctrl-C: aborting without saving; output_dir keeps its earlier checkpoints.\n")
    try:  # the default action, set in C: Python's signal.signal works in the main thread only
        import ctypes

        ctypes.CDLL(None).signal(int(signal.SIGINT), 0)  # SIG_DFL
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
    finally:
        os._exit(128 + signal.SIGINT)


# Past the grace: the C library's own timer ends a process in which no Python thread can run (Linux; elsewhere
# faulthandler's thread, with exit code 1). Every thread's stack is printed halfway there.
EXIT_BACKSTOP_S = 2.0


class _SigEvent(ctypes.Structure):
    """Linux's ``struct sigevent`` (glibc and musl: 64 bytes) for a ``SIGEV_THREAD`` timer."""

    _fields_ = (
        ("value", ctypes.c_void_p),  # union sigval: the argument of the function
        ("signo", ctypes.c_int),
        ("notify", ctypes.c_int),
        ("function", ctypes.c_void_p),
        ("attributes", ctypes.c_void_p),
        ("padding", ctypes.c_byte * (64 - 3 * ctypes.sizeof(ctypes.c_void_p) - 8)),
    )


class _TimeSpec(ctypes.Structure):
    _fields_ = (("seconds", ctypes.c_long), ("nanoseconds", ctypes.c_long))


class _ITimerSpec(ctypes.Structure):
    _fields_ = (("interval", _TimeSpec), ("value", _TimeSpec))


class _NativeExit:
    """A POSIX timer whose expiry calls the C library's ``_exit(code)`` on a thread the C library starts: it needs
    neither the interpreter lock nor any Python thread, so it ends a process whatever holds those (a library's C call
    that keeps the interpreter lock, a destructor). Created before it is needed; arming it is one system call."""

    SIGEV_THREAD, CLOCK_MONOTONIC = 2, 1

    def __init__(self, code: int) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.timer = ctypes.c_void_p()
        exit_now = ctypes.cast(self.libc["_exit"], ctypes.c_void_p).value  # the C function _exit(2), by name
        self.event = _SigEvent(value=code, notify=self.SIGEV_THREAD, function=exit_now)  # _exit(code)
        if self.libc.timer_create(self.CLOCK_MONOTONIC, ctypes.byref(self.event), ctypes.byref(self.timer)):
            raise OSError(ctypes.get_errno(), "timer_create failed")

    def arm(self, seconds: float) -> None:
        whole = int(seconds)
        when = _ITimerSpec(value=_TimeSpec(whole, int((seconds - whole) * 1e9)))
        if self.libc.timer_settime(self.timer, 0, ctypes.byref(when), None):
            raise OSError(ctypes.get_errno(), "timer_settime failed")

    @classmethod
    def create(cls, code: int) -> _NativeExit | None:
        if not sys.platform.startswith("linux"):  # the sigevent layout above is Linux's
            return None
        try:
            return cls(code)
        except (OSError, AttributeError):  # no timer_create in the C library (glibc before 2.34 has it in librt)
            return None


class _ExitTimer:
    """Ends the process with ``code`` some seconds after `arm`, whatever runs then. Made before any stop
    (`StopOnSignal.install`), so that the stop itself creates nothing: a daemon thread blocked on a pipe, which
    flushes the output and exits, and the native timer, for a process in which that thread cannot run."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.native = _NativeExit.create(code)
        self.reading, self.writing = os.pipe()
        self.armed = False
        threading.Thread(target=self._wait, name="riskpo-exit", daemon=True).start()

    def _wait(self) -> None:
        seconds = float(os.read(self.reading, 64).decode().split()[0])
        time.sleep(seconds)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(self.code)

    def arm(self, seconds: float) -> None:
        """Once: a later call (a further signal) neither postpones nor advances the exit."""
        if self.armed:
            return
        self.armed = True
        if self.native is not None:
            # Every stack, if the thread could not run: what held the process.
            faulthandler.dump_traceback_later(seconds + EXIT_BACKSTOP_S / 2)
            self.native.arm(seconds + EXIT_BACKSTOP_S)
        else:
            faulthandler.dump_traceback_later(seconds + EXIT_BACKSTOP_S, exit=True)
        os.write(self.writing, f"{seconds} ".encode())


_exit_timers: dict[int, _ExitTimer] = {}


def start_exit_timer(code: int = STOPPED_EXIT_CODE) -> None:
    """Make what `exit_within` arms (once a process and code, in the main thread, before training)."""
    if code not in _exit_timers:
        _exit_timers[code] = _ExitTimer(code)


def exit_within(seconds: float, code: int) -> None:
    """End the process with ``code`` ``seconds`` from now, whatever thread or request still runs (a process that
    exits sooner ends it): the timer thread flushes the output and exits. Where no Python thread can run by then
    (a C call holding the interpreter lock), every thread's stack is printed and the C library's timer ends the process
    with ``code`` at ``seconds + EXIT_BACKSTOP_S`` (Linux; elsewhere faulthandler's thread does, with exit code 1,
    and a launcher script still reads the stop from its file). Armed once; later calls change nothing."""
    start_exit_timer(code)  # made already in a training script's process (`StopOnSignal.install`)
    _exit_timers[code].arm(seconds)


def end_process_after_stop() -> None:
    """After a stopped run let go of all it holds (checkpoint, stop line, process group, run lock): end the process
    with :data:`STOPPED_EXIT_CODE` now. The interpreter's own shutdown would run library finalizers first, which took
    about 8 s more in this project's two-process server-mode tests, and can wait on a hung server's connection."""
    import logging

    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(STOPPED_EXIT_CODE)
