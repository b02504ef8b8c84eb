"""A fork server for the training jobs of one machine.

A `python -m dlcrepro train` process spends ~9 s importing torch, vLLM and transformers and ~3 s
tearing them down, against ~20 s of training in a tiny-default cell. The server imports those
libraries once and then waits on a Unix socket. A job started with `--server PATH` hands its
command line, working directory, environment and standard streams to the server; the server forks
a child that runs the job through the same `cli.main` the job's own process would run, with the
job's stdin/stdout/stderr, and the child's exit status becomes the job's. Killing the job (Snakemake
cancelling it, Ctrl-C) kills the child.

What is shared is only third-party code: every child imports `dlcrepro` afresh, so an edit to the
package takes effect at the next job.

The server runs, as its owner, whatever command line and environment a connecting process sends,
so only its owner may connect: the default socket lives in a directory only the owner can enter
(`private_dir`), and the server checks each connecting process's uid (SO_PEERCRED, which the
kernel fills in; nothing the client says) and closes any connection from another uid unanswered.
The client checks the other way: it hands its job only to a server of its own uid (the socket
file's owner and, again by SO_PEERCRED, the listening process's), never its command line and
environment to another user's process.

When the server stops (SIGTERM, SIGINT, or the watched process gone) it sends SIGTERM to the jobs
it forked that still run: no job outlives the snakemake that started the server.

A job falls back to running in its own process, saying so on stderr, when no server answers at
PATH, when the server refuses its uid or runs another python or another copy of the package, and
always inside a Slurm allocation (a forked child would run outside the job's cgroup). Nothing the
server does is needed for a result: it only saves process start-up.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..core import procs
from ..core.preload import import_job_modules

REFUSED = -1 << 16  # status sent instead of an exit code when the server will not run a job
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_HEADER = struct.Struct("!I")
_STATUS = struct.Struct("!i")


def private_dir() -> Path:
    """This user's directory for server sockets, under the node-local temp directory (a socket on a
    shared file system cannot be reached from other nodes anyway). Created 0700; an existing one
    must be a real directory of ours that no one else can enter, else another user could reach or
    replace the sockets in it."""
    d = Path(tempfile.gettempdir()) / f"dlcrepro-{os.getuid()}"
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)  # not stat: a symlink planted there must not lead elsewhere
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else "file"
        raise PermissionError(
            f"dlcrepro: {d} must be a directory of uid {os.getuid()} that only its owner can enter, not a "
            f"{kind} of uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: remove it (or chmod 700 it if it is yours)"
        )
    return d


def default_socket(workdir: str | Path, python: str) -> str:
    """The socket of the server of a working directory and python, in `private_dir()`."""
    key = f"{Path(workdir).resolve()}\0{python}".encode()
    return str(private_dir() / f"{hashlib.sha1(key).hexdigest()[:12]}.sock")


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket, as the kernel recorded it."""
    _, uid, _ = _PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid


def _identity() -> dict:
    import dlcrepro

    return {"python": os.path.realpath(sys.prefix), "package": os.path.realpath(os.path.dirname(dlcrepro.__file__))}


# --------------------------------------------------------------------------- client


def run_via_server(path: str, argv: list[str]) -> int | None:
    """Run `argv` (the arguments of `python -m dlcrepro`) in a child of the server at `path`;
    its exit status, or None if the job should run in this process (the reason is on stderr)."""
    if os.environ.get("SLURM_JOB_ID"):
        return None  # the allocation's cgroup must hold the work
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        owner = os.lstat(path).st_uid
        s.connect(path)
    except OSError as e:
        print(f"dlcrepro: no training server at {path} ({e.strerror}): running in this process", file=sys.stderr)
        s.close()
        return None
    server_uid = peer_uid(s)
    if not owner == server_uid == os.getuid():  # never hand a command line and environment to another user
        print(f"dlcrepro: the training server at {path} is not yours (socket of uid {owner}, server of uid {server_uid}; "
              f"you are uid {os.getuid()}): refused, running in this process", file=sys.stderr)
        s.close()
        return None
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), **_identity()}).encode()
    for f in (sys.stdout, sys.stderr):
        f.flush()
    with s:
        reply = b""
        try:
            socket.send_fds(s, [_HEADER.pack(len(request)) + request], [0, 1, 2])
            while len(reply) < _STATUS.size:
                chunk = s.recv(_STATUS.size - len(reply))
                if not chunk:
                    print("dlcrepro: the job's process on the training server ended without an exit status (killed?)",
                          file=sys.stderr)
                    return 1
                reply += chunk
        except OSError as e:  # EPIPE, ECONNRESET: the server closed the connection without reading the job
            print(f"dlcrepro: the training server at {path} refused the connection ({e.strerror}): running in this process",
                  file=sys.stderr)
            return None
    (status,) = _STATUS.unpack(reply)
    if status == REFUSED:
        print(f"dlcrepro: the training server at {path} runs another python or package: running in this process", file=sys.stderr)
        return None
    return status


# --------------------------------------------------------------------------- server


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < _HEADER.size:
        raise ConnectionError("short request")
    (n,) = _HEADER.unpack(data[: _HEADER.size])
    body = data[_HEADER.size :]
    while len(body) < n:
        chunk = conn.recv(n - len(body))
        if not chunk:
            raise ConnectionError("request cut short")
        body += chunk
    return json.loads(body), fds


def _child(conn: socket.socket) -> None:
    """In the forked child: become the job, run it, report its status. Never returns."""
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        req, fds = _recv_request(conn)
        if {k: req.get(k) for k in ("python", "package")} != _identity():
            conn.sendall(_STATUS.pack(REFUSED))
            os._exit(0)
        for fd, target in zip(fds, (0, 1, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        os.environ.pop("DLCREPRO_SERVER", None)  # this is the job's process: it must not forward again
        os.environ[procs.FORKED_ENV] = str(os.getpid())  # the job records how it started (its summary)
        sys.argv = [sys.argv[0], *req["argv"]]

        def watch() -> None:  # the job's process went away: so does its work
            try:
                while conn.recv(1):
                    pass
            except OSError:
                pass
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=watch, daemon=True).start()

        import torch

        torch.set_num_threads(max(int(os.environ.get("OMP_NUM_THREADS", "1") or 1), 1))
        for name in [m for m in sys.modules if m == "dlcrepro" or m.startswith("dlcrepro.")]:
            del sys.modules[name]  # the job runs the package as it is on disk now
        from dlcrepro.run.cli import main

        try:
            status = main(req["argv"])
        except SystemExit as e:  # as the interpreter does: an int is the status, anything else is printed
            if e.code is None or isinstance(e.code, int):
                status = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                status = 1
    except BaseException:  # noqa: BLE001 - reported like an uncaught exception, then exit 1
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.sendall(_STATUS.pack(int(status or 0)))
        except OSError:
            pass
        os._exit(0)


def serve(path: str, watch_pid: int | None = None, idle_seconds: float | None = None) -> None:
    """Import the heavy libraries, listen at `path`, fork a child per connection; return when the
    process `watch_pid` is gone, after `idle_seconds` without a job, or on SIGTERM/SIGINT."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(1)  # no OpenMP worker threads exist when a child is forked
    import_job_modules()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        print(f"dlcrepro serve: a server already listens at {path}", file=sys.stderr)
        return
    except OSError:
        pass
    finally:
        probe.close()
    tmp = f"{path}.{os.getpid()}"
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(tmp)
    lsock.listen(64)
    os.replace(tmp, path)  # clients only ever see a socket that listens
    ino = os.stat(path).st_ino
    lsock.settimeout(1.0)
    print(f"dlcrepro serve: listening at {path} after {time.perf_counter() - t0:.1f} s of imports", file=sys.stderr, flush=True)

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    last = time.monotonic()
    jobs = 0
    try:
        while not stop:
            # a killed snakemake not yet reaped (a zombie) counts as gone
            if watch_pid is not None and not procs.alive(watch_pid):
                break
            if idle_seconds is not None and time.monotonic() - last > idle_seconds:
                break
            try:
                conn, _ = lsock.accept()
            except (TimeoutError, socket.timeout, InterruptedError):
                continue
            conn.settimeout(None)
            last = time.monotonic()
            uid = peer_uid(conn)
            if uid != os.getuid():
                print(f"dlcrepro serve: refused a connection from uid {uid}", file=sys.stderr, flush=True)
                conn.close()
                continue
            jobs += 1
            for f in (sys.stdout, sys.stderr):
                f.flush()
            pid = os.fork()
            if pid == 0:
                lsock.close()
                _child(conn)
            conn.close()
            print(f"dlcrepro serve: job {jobs} in pid {pid}", file=sys.stderr, flush=True)
    finally:
        lsock.close()
        try:
            if os.stat(path).st_ino == ino:  # still ours
                os.unlink(path)
        except OSError:
            pass
        running = stop_children()
        print(f"dlcrepro serve: stopped after {jobs} jobs" + (f", {len(running)} of them stopped running" if running else ""),
              file=sys.stderr, flush=True)


def stop_children() -> list[int]:
    """SIGTERM the jobs this server forked that still run (its children, as /proc says); their pids."""
    running = [pid for pid in procs.children(os.getpid()) if procs.alive(pid)]
    for pid in running:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return running
