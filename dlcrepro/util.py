"""The few I/O helpers everything shares: atomic writes and logging."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename: no half file ever looks finished."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_save(path: Path, write) -> None:
    """Call `write(tmp_path)` then rename to `path` (for writers that need a file name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def log(msg: str) -> None:
    print(f"[dlcrepro {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class NonFiniteError(RuntimeError):
    """A training metric or the update direction is NaN or infinite: the run stops before using it."""
