"""The pieces the fault tests (tests/test_faults.py) stand on, on small exact cases: the message of
a full disk, atomic writes that leave nothing behind, a checkpoint's sidecar telling a whole file
from a cut one, and stopping a process tree."""

import errno

import pytest

from dlcrepro.util import DiskFullError, atomic_save_stream, atomic_write_text, disk_full, file_digest


def test_a_full_disk_is_named_with_its_mount_point_and_what_to_do(tmp_path):
    e = disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "cell" / "checkpoint.pt")
    assert isinstance(e, DiskFullError) and e.errno == errno.ENOSPC
    text = str(e)
    assert f"no space left on device writing {tmp_path / 'cell' / 'checkpoint.pt'} on the file system at " in text
    assert " free of " in text and "and rerun the same command" in text and "nothing half-written was kept" in text
    too_large = str(disk_full(OSError(errno.EFBIG, "File too large"), tmp_path / "x"))
    assert "file too large" in too_large and "ulimit -f" in too_large
    assert disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path / "x") is None
    assert disk_full(ValueError("not an OSError"), tmp_path / "x") is None


def test_a_failed_atomic_write_leaves_neither_a_temporary_nor_a_final_file(tmp_path):
    def fails(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError, match="no space left on device writing"):
        atomic_save_stream(tmp_path / "table.parquet", fails)
    assert list(tmp_path.iterdir()) == []
    digest = atomic_write_text(tmp_path / "ok.txt", "whole")
    assert digest == file_digest(tmp_path / "ok.txt") and digest["bytes"] == 5
