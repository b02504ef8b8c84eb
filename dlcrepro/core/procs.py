"""Stopping a process tree at once, as /proc (Linux) shows it: what a stopped snakemake does to its
jobs and the fork server (workflow/rules/common.smk), and the fork server to its children.

Stdlib only: the Snakefile imports it from the checkout.
"""

from __future__ import annotations

import os
import signal
import threading
import time


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


# set by the fork server in each child it forks, to the child's pid (server.py): that process did not
# import torch and vLLM itself (a process it starts inherits the variable, not the pid)
FORKED_ENV = "DLCREPRO_FORKED_CHILD"


def how_started() -> str:
    """"fork server child" in a job the fork server forked, else "own process"."""
    return "fork server child" if os.environ.get(FORKED_ENV) == str(os.getpid()) else "own process"


def seconds_since_start() -> float | None:
    """Seconds since this process began: for a job in its own process, its interpreter's start and
    imports so far; for a fork server's child, the seconds since the fork. None where /proc has no
    start time."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: clock ticks after boot
    except (OSError, IndexError, ValueError):
        return None
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK"))


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None and st[1] == pid:
            out.append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below `pid`: its children, theirs, and so on (one pass over /proc)."""
    below: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            below.setdefault(st[1], []).append(int(name))
    out, todo = [], [pid]
    while todo:
        kids = below.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, dead but not yet reaped, does not)."""
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_descendants(root: int | None = None, grace: float = 5.0, poll: float = 0.2) -> threading.Thread:
    """SIGTERM every process below `root` (default: this one) now, then, in a daemon thread until
    this process exits, any that appears below it later; SIGKILL what still runs `grace` seconds
    after its SIGTERM. A process once signalled is followed even when its parent is gone (a fork
    server's child is re-parented when the server exits first). The thread is returned."""
    root = os.getpid() if root is None else root
    signalled: dict[int, float] = {}

    def sweep() -> None:
        now = time.monotonic()
        for pid in descendants(root):
            if pid not in signalled:
                _kill(pid, signal.SIGTERM)
                signalled[pid] = now
        for pid, t in list(signalled.items()):
            if not alive(pid):
                del signalled[pid]
            elif now - t > grace:
                _kill(pid, signal.SIGKILL)

    def keep_sweeping() -> None:
        while True:
            time.sleep(poll)
            sweep()

    sweep()
    t = threading.Thread(target=keep_sweeping, name="stop-descendants", daemon=True)
    t.start()
    return t


# A test stops a training job at known moments to kill it there (tests/conftest.py, kill_in_a_chain):
# DLCREPRO_PAUSE_AT=<point>[:<n>][,<point>[:<n>]...] lists the moments in order, each a step phase of
# phases.PHASES entered for the n-th time in this process, or one of PAUSE_POINTS. With
# DLCREPRO_PAUSE_FILE=<path>, a process stops at the first listed moment not yet taken: it writes its pid
# to <path>.<i> (i the moment's index) and stops itself (SIGSTOP). The test kills it; snakemake's retry,
# a new process, finds moment i taken and stops at moment i+1; the retry after the last one goes on.
PAUSE_ENV, PAUSE_FILE_ENV = "DLCREPRO_PAUSE_AT", "DLCREPRO_PAUSE_FILE"
PAUSE_POINTS = ("checkpoint_written", "finished_record", "summary_written", "checkpoint_removed")
_passes: dict[str, int] = {}


def pause_file(path: str | os.PathLike, index: int) -> str:
    """Where the process that stops at the `index`-th moment of DLCREPRO_PAUSE_AT writes its pid."""
    return f"{os.fspath(path)}.{index}"


def pause_point(point: str) -> None:
    """Stop this process here if this pass of `point` is the next untaken moment of DLCREPRO_PAUSE_AT
    (above); else nothing."""
    want, path = os.environ.get(PAUSE_ENV), os.environ.get(PAUSE_FILE_ENV)
    if not want or not path:
        return
    _passes[point] = _passes.get(point, 0) + 1
    moments = want.split(",")
    index = next((i for i in range(len(moments)) if not os.path.exists(pause_file(path, i))), None)
    if index is None:  # every moment taken: the last retry runs to its end
        return
    name, _, n = moments[index].partition(":")
    if name != point or _passes[point] != int(n or 1):
        return
    try:
        fd = os.open(pause_file(path, index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # taken meanwhile by another process
        return
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGSTOP)
