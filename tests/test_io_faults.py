"""The pieces the fault tests (tests/test_faults.py) stand on, on small exact cases: the message of
a full disk, atomic writes that leave nothing behind, a checkpoint's sidecar telling a whole file
from a cut one, and stopping a process tree."""

import errno
import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, stopped_after, wait_for

from dlcrepro.core import procs
from dlcrepro.core.util import DiskFullError, atomic_save_stream, atomic_write_text, disk_full, file_digest


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


def test_a_checkpoints_sidecar_tells_a_whole_file_from_a_cut_one_and_from_another_run(tmp_path):
    from dlcrepro.step import checkpoint

    run = {"cell": {"sampler": "stale"}, "config": {"train": {"lr": 0.3}}}
    path = tmp_path / "checkpoint.pt"
    first = checkpoint.save(path, {"x": 1}, run, 2, None)
    second = checkpoint.save(path, {"x": 2}, run, 4, first)
    assert [f["step"] for f in json.loads(checkpoint.sidecar(path).read_text())["files"]] == [4, 2]
    assert checkpoint.verify(path, run) == second and checkpoint.verified_step(path) == 4
    with pytest.raises(checkpoint.BadCheckpoint, match=r"is of another run \(config.train.lr: 0.3 there, 0.15 here\)"):
        checkpoint.verify(path, {**run, "config": {"train": {"lr": 0.15}}})
    with open(path, "r+b") as f:
        f.truncate(second["bytes"] - 1)
    with pytest.raises(checkpoint.BadCheckpoint, match=r"is damaged \(truncated: ") as bad:
        checkpoint.verify(path, run)
    assert bad.value.kind == "damaged" and checkpoint.verified_step(path) is None
    assert checkpoint.set_aside(path, "damaged") == tmp_path / "checkpoint.pt.damaged"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt.damaged", "checkpoint.pt.damaged.json"]
    checkpoint.save(path, {"x": 3}, run, 6, None)
    checkpoint.sidecar(path).unlink()  # a checkpoint nothing vouches for (one written before sidecars existed)
    with pytest.raises(checkpoint.BadCheckpoint, match=r"has no checkpoint.pt.json beside it") as bad:
        checkpoint.verify(path, run)
    assert bad.value.kind == "unverified"


# a process with a child that ignores SIGTERM and a grandchild: stopping what is below it must come
# to SIGKILL for the child
TREE = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import signal, subprocess; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); subprocess.Popen([\"sleep\", \"600\"]).wait()']); time.sleep(600)")


def test_stopping_a_tree_ends_every_process_below_even_one_that_ignores_sigterm():
    top = subprocess.Popen([sys.executable, "-c", TREE])  # stands for snakemake: what is below it goes, it stays
    try:
        below = wait_for("the tree below", lambda: d if len(d := procs.descendants(top.pid)) == 2 else None, 20)
        # from a process of its own, as snakemake's handler does (its sweeping thread lives as long as it)
        stopper = subprocess.Popen([sys.executable, "-c",
                                    f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from dlcrepro.core import procs; "
                                    f"procs.stop_descendants({top.pid}, grace=0.5); time.sleep(5)"])
        t0 = time.monotonic()
        wait_for("the tree below gone", lambda: not any(procs.alive(p) for p in below), 5)
        print(f"gone in {time.monotonic() - t0:.1f} s")
        assert procs.alive(top.pid)
        stopper.kill()  # it would sweep on for seconds; nothing is left below
        stopper.wait(timeout=30)
    finally:
        top.kill()
        top.wait()


def test_a_failed_test_leaves_nothing_running():
    proc = subprocess.Popen(["sleep", "600"])
    with pytest.raises(AssertionError):
        with stopped_after(proc):
            raise AssertionError("a test failing while its process runs")
    assert proc.returncode is not None
