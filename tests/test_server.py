"""The fork server: a job run through it is the job run in its own process, only faster to start."""

import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from conftest import ROOT
from test_train import run, train_cmd

from dlcrepro import server
from dlcrepro.cli import _without_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("server")
    path, log = str(d / "s.sock"), d / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "dlcrepro", "serve", "--socket", path, "--watch-pid", str(os.getpid())],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    deadline = time.time() + 180
    while not os.path.exists(path):
        assert proc.poll() is None and time.time() < deadline, log.read_text()
        time.sleep(0.2)
    yield path, log
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert not os.path.exists(path), "the server removes its socket when it stops"


def test_a_job_through_the_server_writes_what_its_own_process_writes(served, tiny_model_dir, tmp_path):
    path, log = served
    sets = ("train.steps=3",)
    p = run(train_cmd(tiny_model_dir, tmp_path / "own", "fp8_stale", "is_center", *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    p = run(train_cmd(tiny_model_dir, tmp_path / "forked", "fp8_stale", "is_center", *sets) + ["--server", path])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "running in this process" not in p.stderr and "finished" in p.stderr  # the child wrote to the job's stderr
    assert '"final_test_accuracy"' in p.stdout  # ... and to its stdout
    assert re.search(r"job \d+ in pid \d+", log.read_text())
    a, b = (pd.read_parquet(tmp_path / d / "metrics.parquet") for d in ("own", "forked"))
    cols = [c for c in a.columns if not c.startswith("sec_")]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_the_jobs_exit_status_and_error_come_back(served, tiny_model_dir, tmp_path):
    p = run(train_cmd(tiny_model_dir, tmp_path / "x", "fp4", "dlc") + ["--server", served[0]])
    assert p.returncode == 2 and "unknown sampler 'fp4'" in p.stderr


def test_killing_the_job_kills_its_child(served, tiny_model_dir, tmp_path):
    path, log = served
    n_before = len(re.findall(r"job \d+ in pid", log.read_text()))
    out = tmp_path / "long"
    proc = subprocess.Popen(train_cmd(tiny_model_dir, out, "stale", "dlc", "train.steps=500") + ["--server", path],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (out / "train.log").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.1)
    pid = int(re.findall(r"job \d+ in pid (\d+)", log.read_text())[n_before])
    assert os.path.exists(f"/proc/{pid}")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    deadline = time.time() + 20
    while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), "the forked job outlived the job that started it"
    assert not (out / "summary.json").exists()


def test_jobs_run_in_their_own_process_without_a_matching_server(served, monkeypatch, capsys):
    path = served[0]
    assert server.run_via_server(str(path) + ".absent", ["train"]) is None
    assert "no training server" in capsys.readouterr().err
    monkeypatch.setattr(server, "_identity", lambda: {"python": sys.executable, "package": "/elsewhere/dlcrepro"})
    assert server.run_via_server(path, ["--help"]) is None  # another copy of the package: refused
    assert "another python or package" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert server.run_via_server(path, ["--help"]) is None  # inside an allocation: never forked outside it


def test_the_forwarded_command_line_drops_only_the_server_option():
    argv = ["train", "--seed", "0", "--server", "/tmp/s", "--out", "o", "--server=/tmp/t"]
    assert _without_server(argv) == ["train", "--seed", "0", "--out", "o"]
