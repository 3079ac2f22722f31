"""A small seccomp filter for sandboxed programs, as the classic BPF program bwrap's ``--seccomp FD`` loads.

It refuses, with EPERM, the system calls that a test program never needs and that would let it step around the
sandbox's other layers: tracing or reading other processes (``ptrace``, ``process_vm_readv``/``writev``), memory
no rlimit counts (``memfd_create``, ``memfd_secret``, SysV ``shmget`` and ``msgget``), kernel interfaces with a long
record of exploitable bugs (``io_uring_*``, ``bpf``, ``userfaultfd``, ``perf_event_open``, the keyring calls),
``personality`` (which can, e.g., turn off address-space randomisation) and ``io_setup``: Linux AIO contexts count
against one limit for the whole host (``fs.aio-max-nr``), which no namespace or rlimit divides, so a program could take
them all from the host's own AIO users; nothing in the standard library uses it, and without a context the other
``io_*`` calls do nothing.

It also closes what the namespaces leave shared between concurrent sandboxes and with the host:

* **Sockets**: ``socket`` and ``socketpair`` fail with EAFNOSUPPORT whatever the family: the runner needs none, and
  the runner's audit hook already refuses every socket to programs. The filter makes that hold without the hook,
  above all for ``AF_VSOCK``, which no namespace confines (its ports are one space for the whole VM, so a program
  could take a port the VM's own agent needs).
* **File-system watches**: ``inotify_*``, ``fanotify_*`` and ``fcntl(F_NOTIFY)`` are refused: on the read-only files
  every sandbox shares (the interpreter and its standard library) they would show which files the trainer and the
  other sandboxes open.
* **File locks**: ``flock`` and the lock and lease commands of ``fcntl`` (``F_GETLK``, ``F_SETLK``, ``F_SETLKW``, their
  ``F_OFD_`` forms, ``F_SETLEASE``, ``F_GETLEASE``) are refused: a lock on a shared file (a standard-library module,
  ``/dev/null``) is seen by every other sandbox, a channel between two completions. Programs that lock files of their
  own lose that too (e.g. ``sqlite3`` on a database file; ``:memory:`` databases take no lock).

Everything else is allowed: the rest is bubblewrap's job. System calls of another ABI than the native one (x32
numbers, 32-bit ``int 0x80``) are refused as a whole, so that the numbers below cannot be bypassed (and neither can the
32-bit ``socketcall`` multiplexer, which the native ABIs here lack). Written here rather than with libseccomp so the
trainer needs no extra package.
"""

from __future__ import annotations

import errno
import platform
import struct

# Linux's audit architecture numbers and the system call numbers of each supported architecture: the calls refused
# outright, then those whose first or second argument decides.
_ARCHES = {
    "x86_64": (
        0xC000003E,
        {
            "shmget": 29,
            "msgget": 68,
            "flock": 73,
            "ptrace": 101,
            "personality": 135,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "inotify_init": 253,
            "inotify_add_watch": 254,
            "inotify_rm_watch": 255,
            "inotify_init1": 294,
            "perf_event_open": 298,
            "fanotify_init": 300,
            "fanotify_mark": 301,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "memfd_create": 319,
            "bpf": 321,
            "userfaultfd": 323,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "memfd_secret": 447,
            "io_setup": 206,
        },
        {"socket": 41, "socketpair": 53, "fcntl": 72},
    ),
    "aarch64": (
        0xC00000B7,
        {  # no inotify_init: aarch64 has inotify_init1 only
            "inotify_init1": 26,
            "inotify_add_watch": 27,
            "inotify_rm_watch": 28,
            "flock": 32,
            "personality": 92,
            "ptrace": 117,
            "msgget": 186,
            "shmget": 194,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "perf_event_open": 241,
            "fanotify_init": 262,
            "fanotify_mark": 263,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "memfd_create": 279,
            "bpf": 280,
            "userfaultfd": 282,
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "memfd_secret": 447,
            "io_setup": 0,
        },
        {"socket": 198, "socketpair": 199, "fcntl": 25},
    ),
}
DENIED = tuple(sorted(_ARCHES["x86_64"][1]))
ALLOWED_SOCKET_FAMILIES: tuple[int, ...] = ()  # none: see the module docstring
# fcntl commands refused: record locks (classic and open-file-description), leases and directory notifications
DENIED_FCNTL_COMMANDS = {
    "F_GETLK": 5,
    "F_SETLK": 6,
    "F_SETLKW": 7,
    "F_OFD_GETLK": 36,
    "F_OFD_SETLK": 37,
    "F_OFD_SETLKW": 38,
    "F_SETLEASE": 1024,
    "F_GETLEASE": 1025,
    "F_NOTIFY": 1026,
}
_X32_BIT = 0x40000000  # x86_64: system call numbers of the x32 ABI carry this bit

# classic BPF opcodes and seccomp return values
_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000  # SECCOMP_RET_ERRNO, or-ed with the errno
_DENY = _ERRNO | errno.EPERM
_NO_FAMILY = _ERRNO | errno.EAFNOSUPPORT  # what a kernel without the address family answers
# offsets in struct seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6]}; an argument's low 32 bits
# (little-endian), which is all the kernel reads of socket's int family and fcntl's unsigned int cmd
_NR_OFFSET, _ARCH_OFFSET = 0, 4
_ARG_LOW_OFFSET = (16, 24)


def _instruction(code: int, jump_true: int, jump_false: int, value: int) -> bytes:
    return struct.pack("=HBBI", code, jump_true, jump_false, value)


def _assemble(program: list[tuple]) -> bytes:
    """Classic BPF from (code, value) and (code, value, true label, false label) entries and ("label", name) marks;
    a label of None falls through to the next instruction."""
    labels, position = {}, 0
    for entry in program:
        if entry[0] == "label":
            labels[entry[1]] = position
        else:
            position += 1
    encoded, position = [], 0
    for entry in program:
        if entry[0] == "label":
            continue
        code, value, *targets = entry
        jumps = [0 if target is None else labels[target] - position - 1 for target in (targets or [None, None])]
        if not all(0 <= jump <= 255 for jump in jumps):
            raise ValueError(f"seccomp filter: jump out of range at instruction {position}")
        encoded.append(_instruction(code, jumps[0], jumps[1], value))
        position += 1
    return b"".join(encoded)


def denied_syscalls_filter(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture, or None where the system call numbers are not known here."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    arch, denied, argument_checked = _ARCHES[machine]
    program: list[tuple] = [
        (_LOAD_WORD, _ARCH_OFFSET),
        (_JUMP_EQUAL, arch, None, "deny"),  # another ABI
        (_LOAD_WORD, _NR_OFFSET),
    ]
    if machine == "x86_64":
        program.append((_JUMP_AT_LEAST, _X32_BIT, "deny", None))
    program += [(_JUMP_EQUAL, number, "deny", None) for _, number in sorted(denied.items())]
    program += [
        (_JUMP_EQUAL, argument_checked["socket"], "family", None),
        (_JUMP_EQUAL, argument_checked["socketpair"], "family", None),
        (_JUMP_EQUAL, argument_checked["fcntl"], "fcntl", None),
        (_RETURN, _ALLOW),
        ("label", "family"),
        (_LOAD_WORD, _ARG_LOW_OFFSET[0]),
        *[(_JUMP_EQUAL, family, "allow", None) for family in ALLOWED_SOCKET_FAMILIES],
        (_RETURN, _NO_FAMILY),
        ("label", "fcntl"),
        (_LOAD_WORD, _ARG_LOW_OFFSET[1]),
        *[(_JUMP_EQUAL, command, "deny", None) for command in sorted(DENIED_FCNTL_COMMANDS.values())],
        ("label", "allow"),
        (_RETURN, _ALLOW),
        ("label", "deny"),
        (_RETURN, _DENY),
    ]
    return _assemble(program)
