"""The staging server: a root process in the sandboxes' private mount namespace that mounts and unmounts each run's
working directory with the mount system calls (stdlib only; run as ``python -I -S -B -c`` by
`riskpo_trl.code.bwrap.BwrapLauncher`, never imported by the trainer).

Started under ``unshare --mount --net`` with ``--stage DIR PATH...``, it first detaches ``/sys`` (nothing started there
needs it), mounts a small tmpfs on DIR and bind-mounts each PATH under it as DIR/<index> (directories other uids cannot
reach on the host), prints one line and then serves.
Started with ``--serve`` (inside an existing staging namespace, through nsenter), it only serves.

Protocol: one JSON request per line on stdin, one JSON reply per line on stdout, until EOF:

* ``{"op": "mount", "path": P, "size": BYTES, "inodes": N, "uid": UID}``: a fresh tmpfs on P capped in bytes and
  inodes, holding ``home`` and ``shm`` (mode 0700, owned by UID);
* ``{"op": "umount", "path": P}``: detach it and remove P.

The reply is ``{"ok": true}`` or ``{"error": "..."}``. One process doing system calls replaces the five to six helper
programs (nsenter, sh, mkdir, mount, chown, umount) each run used to start: a few milliseconds of CPU per run.
"""

import ctypes
import json
import os
import sys

MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
_libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)


def _encoded(value):
    return None if value is None else os.fsencode(value)


def _mount(source, target, fstype, flags, data):
    if _libc.mount(_encoded(source), _encoded(target), _encoded(fstype), flags, _encoded(data)) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"mounting {fstype or source} on {target}: {os.strerror(number)}")


def stage(directory, private):
    # Nothing started in this namespace needs /sys, and bwrap reads the whole mount table once per mount it makes:
    # detached here (with the cgroup hierarchies under it), that table is about half as long.
    _libc.umount2(b"/sys", MNT_DETACH)  # best effort: a failure leaves a longer table, nothing else
    _mount("riskpo-stage", directory, "tmpfs", 0, "mode=0755,size=1m")
    for index, path in enumerate(private):
        target = os.path.join(directory, str(index))
        if os.path.isdir(path):
            os.mkdir(target)
        else:
            open(target, "w").close()
        _mount(path, target, None, MS_BIND, None)


def mount_workdir(path, size, inodes, uid):
    os.mkdir(path, 0o755)
    _mount("riskpo-work", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(size)},nr_inodes={int(inodes)},mode=0755")
    for name in ("home", "shm"):
        inner = os.path.join(path, name)
        os.mkdir(inner, 0o700)
        os.chmod(inner, 0o700)  # whatever the umask
        os.chown(inner, int(uid), int(uid))


def unmount_workdir(path):
    if _libc.umount2(_encoded(path), MNT_DETACH) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"unmounting {path}: {os.strerror(number)}")
    os.rmdir(path)


def serve(requests, replies):
    for line in requests:
        try:
            request = json.loads(line)
            if request["op"] == "mount":
                mount_workdir(request["path"], request["size"], request["inodes"], request["uid"])
            elif request["op"] == "umount":
                unmount_workdir(request["path"])
            else:
                raise ValueError(f"unknown op {request['op']!r}")
            reply = {"ok": True}
        except Exception as error:  # reported to the trainer, which raises or logs it
            reply = {"error": f"{type(error).__name__}: {error}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv):
    if argv[0] == "--stage":
        try:
            stage(argv[1], argv[2:])
        except OSError as error:
            sys.stdout.write(json.dumps({"error": str(error)}) + "\n")
            return 1
    sys.stdout.write(json.dumps({"ok": True}) + "\n")
    sys.stdout.flush()
    serve(sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
