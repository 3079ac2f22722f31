"""A small seccomp filter for sandboxed programs, as the classic BPF program bwrap's ``--seccomp FD`` loads.

It refuses, with EPERM, the system calls that a test program never needs and that would let it step around the
sandbox's other layers: tracing or reading other processes (``ptrace``, ``process_vm_readv``/``writev``), memory no
rlimit counts (``memfd_create``, ``memfd_secret``, SysV ``shmget`` and ``msgget``), kernel interfaces with a long record of exploitable bugs
(``io_uring_*``, ``bpf``, ``userfaultfd``, ``perf_event_open``, the keyring calls) and ``personality`` (which can,
e.g., turn off address-space randomisation). Everything else is allowed: the rest is bubblewrap's job. System calls
of another ABI than the native one (x32 numbers, 32-bit ``int 0x80``) are refused as a whole, so that the numbers
below cannot be bypassed. Written here rather than with libseccomp so the trainer needs no extra package.
"""

from __future__ import annotations

import errno
import platform
import struct

# Linux's audit architecture numbers and the system call numbers of each supported architecture.
_ARCHES = {
    "x86_64": (0xC000003E, {
        "shmget": 29, "msgget": 68, "ptrace": 101, "personality": 135, "add_key": 248, "request_key": 249, "keyctl": 250,
        "perf_event_open": 298, "process_vm_readv": 310, "process_vm_writev": 311, "memfd_create": 319,
        "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "memfd_secret": 447,
    }),
    "aarch64": (0xC00000B7, {
        "personality": 92, "msgget": 186, "shmget": 194, "ptrace": 117, "add_key": 217, "request_key": 218, "keyctl": 219,
        "perf_event_open": 241, "process_vm_readv": 270, "process_vm_writev": 271, "memfd_create": 279,
        "bpf": 280, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "memfd_secret": 447,
    }),
}
DENIED = tuple(sorted(_ARCHES["x86_64"][1]))
_X32_BIT = 0x40000000  # x86_64: system call numbers of the x32 ABI carry this bit

# classic BPF opcodes and seccomp return values
_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO
_NR_OFFSET, _ARCH_OFFSET = 0, 4  # in struct seccomp_data


def _instruction(code: int, jump_true: int, jump_false: int, value: int) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, value)


def denied_syscalls_filter(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture, or None where the system call numbers are not known here."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    arch, numbers = _ARCHES[machine]
    denied = [numbers[name] for name in DENIED]
    program = [
        _instruction(_LOAD_WORD, 0, 0, _ARCH_OFFSET),
        _instruction(_JUMP_EQUAL, 1, 0, arch),
        _instruction(_RETURN, 0, 0, _DENY),  # another ABI
        _instruction(_LOAD_WORD, 0, 0, _NR_OFFSET),
    ]
    if machine == "x86_64":  # jump over every number check and the allow, to the deny
        program.append(_instruction(_JUMP_AT_LEAST, len(denied) + 1, 0, _X32_BIT))
    for index, number in enumerate(denied):
        program.append(_instruction(_JUMP_EQUAL, len(denied) - index, 0, number))
    program += [_instruction(_RETURN, 0, 0, _ALLOW), _instruction(_RETURN, 0, 0, _DENY)]
    return b"".join(program)
