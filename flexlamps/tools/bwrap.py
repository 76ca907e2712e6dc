"""The OS boundary every tool call runs behind: bubblewrap (`bwrap`, Flatpak's sandbox, packaged by
Debian, Ubuntu and Fedora), 0.8 or newer, with the seccomp filter of seccomp.py.

The child gets fresh user, mount, PID, network, IPC, UTS (and cgroup) namespaces; uid 65534
(nobody), which maps to no privileged host uid; no capabilities and no_new_privs; the seccomp
filter; a filesystem of read-only binds holding only what the interpreter needs (/usr, the
interpreter's prefixes: sys.base_prefix, the venv's sys.prefix; not /etc, /root, /home, the
project, the model or the output folder), /proc of its own PID namespace, a read-only /dev, and
one writable tmpfs of `Limits.disk_bytes` as its work dir (WORK_DIR). All of it vanishes with the
namespaces: there is no host temp dir to clean up.

Who the child is on the host:
- the engine runs as a user: bwrap maps uid 65534 in the sandbox to that user (bwrap's own mapping;
  `--disable-userns` also bars new user namespaces);
- the engine runs as root (containers, CI): mapping to host root is what bwrap would do, so the
  engine writes the maps itself (`--userns-block-fd`): the sandbox's root and 65534 to the same
  host uids. bwrap sets up the mounts as root of that namespace (the interpreter may live under a
  root-only /root) and starts the child with CAP_SETUID / CAP_SETGID only; the child's first lines
  drop to 65534 for good (and check that no capability is left, see _child.py). Where bwrap could
  not reach the interpreter as 65534, this is how the child still runs as 65534.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

SANDBOX_UID = SANDBOX_GID = 65534  # nobody
WORK_DIR = "/sandbox"
CHILD_PATH = "/run/flexlamps/child.py"
MIN_VERSION = (0, 8)
INSTALL = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": WORK_DIR, "TMPDIR": WORK_DIR,
       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@dataclass(frozen=True)
class Fds:
    """The descriptors bwrap is handed (their numbers are the same in the child)."""
    result: int  # write end of the result pipe
    info: int  # bwrap writes the sandbox's pid 1 there (JSON)
    seccomp: int  # read end of a pipe holding the compiled filter
    block: int | None  # root: bwrap waits on it until the engine wrote the uid maps


def as_root() -> bool:
    return os.geteuid() == 0


@functools.lru_cache(maxsize=1)
def executable() -> str | None:
    """bwrap's path, or None when it is missing."""
    return shutil.which("bwrap")


def version_problem(path: str) -> str | None:
    """Why this bwrap will not do (too old, broken), or None."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"{path} does not run ({e}); {INSTALL}"
    found = re.search(r"(\d+)\.(\d+)", out)
    if found is None or tuple(map(int, found.groups())) < MIN_VERSION:
        return f"bubblewrap {'.'.join(map(str, MIN_VERSION))} or newer is needed (found {out.strip()!r}); {INSTALL}"
    return None


def command(bwrap: str, fds: Fds, disk_bytes: int, network: bool, child: str) -> list[str]:
    """bwrap's command line, ending in the child's (see the module's docstring)."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--cap-drop", "ALL", "--info-fd", str(fds.info), "--seccomp", str(fds.seccomp), "--clearenv"]
    if network:
        args.append("--share-net")
    if fds.block is not None:  # root: the engine maps the users; the child drops to 65534 itself
        args += ["--userns-block-fd", str(fds.block), "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--disable-userns", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    for key, value in ENV.items():
        args += ["--setenv", key, value]
    args += _filesystem(child, disk_bytes)
    args += ["--", sys.executable, "-I", "-S", CHILD_PATH, str(fds.result)]
    if fds.block is not None:
        args += [str(SANDBOX_UID), str(SANDBOX_GID)]
    return args


def _filesystem(child: str, disk_bytes: int) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):  # a merged /usr: lib -> usr/lib
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in interpreter_paths():
        args += _parents(path) + ["--ro-bind", path, path]
    args += _parents(CHILD_PATH) + ["--ro-bind", child, CHILD_PATH]
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(disk_bytes), "--tmpfs", WORK_DIR,
             "--chdir", WORK_DIR, "--remount-ro", "/dev", "--remount-ro", "/"]
    return args


def _parents(path: str) -> list[str]:
    """Open (0755) folders above a bind: bwrap copies the host's modes, and /root is 0700."""
    out, parent = [], os.path.dirname(path)
    while parent not in ("/", ""):
        out = ["--perms", "0755", "--dir", parent] + out
        parent = os.path.dirname(parent)
    return out


@functools.lru_cache(maxsize=1)
def interpreter_paths() -> tuple[str, ...]:
    """The folders Python needs outside /usr: its prefixes (the venv's and the base interpreter's),
    outermost only."""
    exe_prefix = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    found = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                           exe_prefix)}
    found = {p for p in found if not _inside(p, "/usr")}
    return tuple(sorted(p for p in found if not any(q != p and _inside(p, q) for q in found)))


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def map_users(info_fd: int, block_fd: int) -> int:
    """Root: write the sandbox's uid and gid maps (its root and 65534 to themselves), then let
    bwrap go on. Returns the host pid of the sandbox's pid 1."""
    pid = sandbox_pid(info_fd)
    maps = f"0 0 1\n{SANDBOX_UID} {SANDBOX_UID} 1\n"
    for name, text in (("setgroups", "deny"), ("uid_map", maps), ("gid_map", maps.replace(str(SANDBOX_UID),
                                                                                          str(SANDBOX_GID)))):
        with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as f:
            f.write(text)
    os.write(block_fd, b"1")
    return pid


def sandbox_pid(info_fd: int) -> int:
    """The host pid of the sandbox's pid 1, from bwrap's --info-fd (which it closes after)."""
    data = b""
    while chunk := os.read(info_fd, 4096):
        data += chunk
    try:
        return int(json.loads(data)["child-pid"])
    except (ValueError, KeyError, TypeError):
        raise OSError(f"bubblewrap did not start the sandbox (its info: {data[:200]!r})") from None
