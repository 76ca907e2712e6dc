"""The sandbox's seccomp filter, compiled to classic BPF by libseccomp (through `pyseccomp`, its
ctypes binding) and handed to bubblewrap with `--seccomp FD`.

Every system call is allowed except those that reach past the namespaces or the kernel's own
state: debugging other processes, mounting, making or joining namespaces, loading kernel code
or BPF, the key store, perf, io_uring (its operations skip seccomp), and the like. They fail with
EPERM, so Python raises PermissionError. clone3 fails with ENOSYS (its flags sit in memory a filter
cannot read), and libc falls back to clone, whose namespace flags are refused. libseccomp checks the
architecture first: a call through another ABI (i386's int 0x80, x32) kills the process.
"""

from __future__ import annotations

import errno
import functools
import tempfile

REFUSED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount", "umount2", "pivot_root", "chroot", "mount_setattr", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "unshare", "setns",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "bpf", "perf_event_open", "userfaultfd", "add_key", "request_key", "keyctl",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "quotactl", "quotactl_fd",
    "swapon", "swapoff", "reboot", "syslog", "acct", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "iopl", "ioperm", "vhangup", "uselib", "nfsservctl", "personality",
    "mbind", "set_mempolicy", "migrate_pages", "move_pages", "fanotify_init",
)
# clone's namespace flags (its first argument on the architectures flexlamps runs on)
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000, "CLONE_NEWTIME": 0x00000080}
TIOCSTI, TIOCLINUX = 0x5412, 0x541C  # ioctls that type into (or read) a terminal


@functools.lru_cache(maxsize=1)
def filter_bpf() -> bytes:
    """The compiled filter (raises ImportError / OSError where libseccomp is missing)."""
    import pyseccomp as sc

    filt = sc.SyscallFilter(sc.ALLOW)
    for name in REFUSED:
        _refuse(filt, sc.ERRNO(errno.EPERM), name)
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS.values():
        filt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in (TIOCSTI, TIOCLINUX):
        filt.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as f:
        filt.export_bpf(f)
        f.seek(0)
        return f.read()


def _refuse(filt, action: int, name: str) -> None:
    try:
        filt.add_rule(action, name)
    except (ValueError, OSError):
        pass  # a call this architecture or libseccomp version does not know: nothing to refuse
