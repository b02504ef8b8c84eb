"""The few I/O helpers everything shares: atomic writes and their digests, disk-full errors, logging."""

from __future__ import annotations

import errno
import hashlib
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# errno of a write that failed for want of room, and how to say it
NO_ROOM = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file too large"}


class DiskFullError(OSError):
    """A write failed for want of room (ENOSPC, EDQUOT) or past the file size limit (EFBIG). The
    message names the file, the file system and what to do; nothing half-written was kept."""


class DamagedFileError(RuntimeError):
    """A file a finished result stands on is not what was written (its size or checksum differ)."""


def mount_point(path: Path) -> Path:
    """The mount point of the file system `path` (or its nearest existing parent) lies on."""
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p):
        p = p.parent
    return p


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def disk_full(exc: BaseException, path: Path) -> DiskFullError | None:
    """`exc` as a DiskFullError naming `path` and its file system, or None if it is not a full disk."""
    code = getattr(exc, "errno", None)
    if code not in NO_ROOM:
        return None
    if code == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        where = "past this process's file size limit" + ("" if limit == resource.RLIM_INFINITY else f" (ulimit -f: {_mb(limit)})")
        fix = "raise the limit (ulimit -f) and rerun the same command"
    else:
        mount = mount_point(Path(path).parent)
        st = os.statvfs(mount)
        where = f"on the file system at {mount} ({_mb(st.f_bavail * st.f_frsize)} free of {_mb(st.f_blocks * st.f_frsize)})"
        fix = f"free space on {mount} and rerun the same command"
    return DiskFullError(code, f"{NO_ROOM[code]} writing {path} {where}: {fix}; nothing half-written was kept, "
                               "and a training cell resumes from its last checkpoint")


def file_digest(path: Path) -> dict:
    """{"bytes": size, "sha256": hex digest} of a file, read in chunks."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def _fsync_dir(d: Path) -> None:
    """Make a rename in `d` durable (a crash after it cannot bring back the old name)."""
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as e:  # a file system that cannot sync a directory (some FUSE mounts) loses only durability
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


@contextmanager
def _temporary(path: Path):
    """A temporary name beside `path` (`.<name>.<pid>.tmp`: a cell's start removes such leftovers),
    removed if the block fails; a full disk is reported as DiskFullError naming `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        full = disk_full(e, path)
        if full is not None:
            raise full from e
        raise


class _HashingWriter:
    """A binary file that hashes what passes through it, and keeps the error a write raised (torch
    reports a failed write as a RuntimeError without its errno)."""

    def __init__(self, f):
        self.f, self.h, self.n, self.error = f, hashlib.sha256(), 0, None

    def write(self, data) -> int:
        try:
            self.f.write(data)
        except OSError as e:
            self.error = e
            raise
        self.h.update(data)
        self.n += len(data)
        return len(data)

    def flush(self) -> None:
        self.f.flush()


def atomic_save_stream(path: Path, write, before_commit=None) -> dict:
    """`write(f)` into a temporary file beside `path`, then flush, fsync and rename it to `path`:
    no half file ever has the final name, and a crash after the rename keeps it. `before_commit(digest)`
    runs between the fsync and the rename (a checkpoint's sidecar). Returns the file's digest
    (`file_digest`), computed as it was written."""
    path = Path(path)
    with _temporary(path) as tmp:
        with open(tmp, "wb") as f:
            w = _HashingWriter(f)
            try:
                write(w)
                f.flush()
            except Exception as e:
                if w.error is not None and w.error is not e:
                    raise w.error from e
                raise
            os.fsync(f.fileno())
        digest = {"bytes": w.n, "sha256": w.h.hexdigest()}
        if before_commit is not None:
            before_commit(digest)
        os.replace(tmp, path)
    _fsync_dir(path.parent)
    return digest


def atomic_write_bytes(path: Path, data: bytes) -> dict:
    """Write `data` to `path` atomically (`atomic_save_stream`); its digest."""
    return atomic_save_stream(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> dict:
    return atomic_write_bytes(path, text.encode())


def write_text_if_changed(path: Path, text: str) -> None:
    """`atomic_write_text`, only where the file holds other text or none: its modification time then
    says when its text last changed (a rule's input that reruns the jobs reading it)."""
    path = Path(path)
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)


def atomic_save(path: Path, write) -> dict:
    """Call `write(tmp_path)` (for writers that need a file name), then fsync and rename to `path`; its digest."""
    path = Path(path)
    with _temporary(path) as tmp:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        digest = file_digest(tmp)
        os.replace(tmp, path)
    _fsync_dir(path.parent)
    return digest


def remove_leftovers(d: Path) -> list[Path]:
    """Remove the temporary files (`.<name>.<pid>.tmp`) a killed writer left in `d`; those removed.
    Only for a directory whose one writer is the caller (a training cell's, during its job)."""
    gone = []
    for tmp in Path(d).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)
        gone.append(tmp)
    return gone


def log(msg: str) -> None:
    print(f"[dlcrepro {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class NonFiniteError(RuntimeError):
    """A training metric or the update direction is NaN or infinite: the run stops before using it."""


class Diverged(NonFiniteError):
    """An update blew the policy's weights up (its direction or the weights not finite, or an engine
    that no longer computes weights grown tenfold): the run diverged. Not a fault of the harness but
    the run's outcome: the cell ends there and records the step (train.train_steps)."""

    def __init__(self, step: int, message: str):
        super().__init__(message)
        self.step = step
