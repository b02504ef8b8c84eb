"""The fork server: a job run through it is the job run in its own process, only faster to start."""

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, wait_for
from test_train import run, train_cmd

from dlcrepro.run import server
from dlcrepro.run.cli import _without_server

NOBODY = 65534


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("server")
    # Test-only: the socket sits where any uid can reach it (pytest's own temp dirs are 0700, and so
    # is the real socket's directory), so that only the server's uid check stands in another uid's way.
    door = Path(tempfile.mkdtemp(prefix="dlcrepro-test-"))
    door.chmod(0o711)
    path, log = str(door / "s.sock"), d / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "dlcrepro", "serve", "--socket", path, "--watch-pid", str(os.getpid())],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    wait_for(f"the server's socket (its log: {log})", lambda: os.path.exists(path), 180, proc, poll=0.2)
    os.chmod(path, 0o777)  # connecting needs write permission on the socket
    yield path, log
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert not os.path.exists(path), "the server removes its socket when it stops"
    door.rmdir()


@pytest.mark.slow
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
    # how each started, for the calibration: the own process's start-up holds its imports (seconds),
    # the child's only its re-import of the package; neither's setup phase holds vLLM's import
    own, forked = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("own", "forked"))
    assert own["process"] == "own process" and forked["process"] == "fork server child", (own, forked)
    assert own["startup_seconds"] > 2 and forked["startup_seconds"] < own["startup_seconds"] / 2, (own, forked)
    assert own["seconds_by_phase"]["setup"] < own["startup_seconds"], own


def test_a_process_started_by_a_forked_job_knows_it_started_on_its_own():
    """The fork server marks its child by pid; a process that child starts inherits the variable,
    not the pid, and records that it started on its own (its start-up holds its own imports)."""
    from dlcrepro.core.procs import FORKED_ENV, how_started

    code = "import os; from dlcrepro.core.procs import how_started; print(how_started())"
    for marked, want in ((str(os.getpid()), "own process"), (None, "own process")):
        env = {k: v for k, v in os.environ.items() if k != FORKED_ENV} | ({FORKED_ENV: marked} if marked else {})
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
        assert p.stdout.strip() == want, p.stderr
    assert how_started() == "own process"  # this test's own process


@pytest.mark.slow
def test_the_jobs_exit_status_and_error_come_back(served, tiny_model_dir, tmp_path):
    p = run(train_cmd(tiny_model_dir, tmp_path / "x", "fp4", "dlc") + ["--server", served[0]])
    assert p.returncode == 2 and "unknown sampler 'fp4'" in p.stderr
    # a job that stops with a message, as the interpreter ends it in its own process: status 1, the message
    p = run(train_cmd(tiny_model_dir, tmp_path / "y", "stale", "dlc", "train.steps") + ["--server", served[0]])
    assert p.returncode == 1 and p.stderr.strip().endswith("--set expects KEY=VALUE, got 'train.steps'"), p.stderr[-2000:]
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_killing_the_job_kills_its_child(served, tiny_model_dir, tmp_path):
    path, log = served
    n_before = len(re.findall(r"job \d+ in pid", log.read_text()))
    out = tmp_path / "long"
    proc = subprocess.Popen(train_cmd(tiny_model_dir, out, "stale", "dlc", "train.steps=500") + ["--server", path],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("the forked job's train.log", (out / "train.log").exists, 120, proc)
    pid = int(re.findall(r"job \d+ in pid (\d+)", log.read_text())[n_before])
    assert os.path.exists(f"/proc/{pid}")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    wait_for("the forked job to end with the job that started it", lambda: not os.path.exists(f"/proc/{pid}"), 20)
    assert not (out / "summary.json").exists()


@pytest.mark.slow
def test_jobs_run_in_their_own_process_without_a_matching_server(served, monkeypatch, capsys):
    path = served[0]
    assert server.run_via_server(str(path) + ".absent", ["train"]) is None
    assert "no training server" in capsys.readouterr().err
    monkeypatch.setattr(server, "_identity", lambda: {"python": sys.executable, "package": "/elsewhere/dlcrepro"})
    assert server.run_via_server(path, ["--help"]) is None  # another copy of the package: refused
    assert "another python or package" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert server.run_via_server(path, ["--help"]) is None  # inside an allocation: never forked outside it


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another uid needs root")
def test_a_connection_from_another_uid_is_refused_and_runs_nothing(served):
    """The server runs what it is sent as its owner: another uid that reaches the socket and sends
    it a job gets nothing run; that uid's own client does not even send it, and its job falls back
    to its own process."""
    path, log = served
    n_jobs = len(re.findall(r"job \d+ in pid", log.read_text()))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, then hand the server a job, by hand and through the client
        status = 2
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
                request = json.dumps({"argv": ["--help"], "cwd": "/", "env": {}, **server._identity()}).encode()
                try:
                    socket.send_fds(s, [server._HEADER.pack(len(request)) + request], [0, 1, 2])
                    reply = s.recv(server._STATUS.size)
                except OSError:
                    reply = b""
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                fell_back = server.run_via_server(path, ["--help"]) is None
            os.write(w, err.getvalue().encode())
            status = 0 if reply == b"" and fell_back else 1
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0, err  # no status came back; the client ran it itself
    assert f"is not yours (socket of uid 0, server of uid 0; you are uid {NOBODY})" in err and "running in this process" in err
    assert f"refused a connection from uid {NOBODY}" in log.read_text()
    assert len(re.findall(r"job \d+ in pid", log.read_text())) == n_jobs  # nothing forked


@pytest.mark.skipif(os.geteuid() != 0, reason="a server of another uid needs root")
def test_the_client_refuses_a_server_of_another_uid_and_sends_it_nothing(capsys):
    """The client hands its command line and environment (its tokens, its paths) only to a server of
    its own uid: a socket another user listens on gets nothing, and the job runs in its own process."""
    door = Path(tempfile.mkdtemp(prefix="dlcrepro-test-"))
    door.chmod(0o777)  # nobody may create its socket here
    path = str(door / "s.sock")
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody's server, counting the bytes a client sends it
        status = 2
        try:
            os.close(ready_r)
            os.close(got_r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ls:
                ls.bind(path)
                ls.listen(1)
                ls.settimeout(60)
                os.write(ready_w, b"1")
                conn, _ = ls.accept()
                conn.settimeout(60)
                n = 0
                while chunk := conn.recv(1 << 16):
                    n += len(chunk)
            os.write(got_w, str(n).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(ready_w)
    os.close(got_w)
    try:
        assert os.read(ready_r, 1) == b"1"
        assert server.run_via_server(path, ["--help"]) is None
        err = capsys.readouterr().err
        assert f"is not yours (socket of uid {NOBODY}, server of uid {NOBODY}; you are uid 0)" in err
        assert "running in this process" in err
        with os.fdopen(got_r) as f:
            received = f.read()
        assert received == "0", f"the other uid's server received {received} bytes"
    finally:
        os.waitpid(pid, 0)
        shutil.rmtree(door)


def test_the_socket_directory_is_private_and_a_lax_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    d = server.private_dir()
    assert d.parent == tmp_path and (d.stat().st_mode & 0o777) == 0o700
    assert Path(server.default_socket(tmp_path, sys.executable)).parent == d
    d.chmod(0o755)
    with pytest.raises(PermissionError, match=f"only its owner can enter, not a directory of uid {os.getuid()} with mode 0755"):
        server.private_dir()
    d.rmdir()
    d.symlink_to(tmp_path)  # a planted link, even to a directory of ours, is not the directory
    with pytest.raises(PermissionError, match="not a symlink"):
        server.private_dir()


def test_the_forwarded_command_line_drops_only_the_server_option():
    argv = ["train", "--seed", "0", "--server", "/tmp/s", "--out", "o", "--server=/tmp/t"]
    assert _without_server(argv) == ["train", "--seed", "0", "--out", "o"]
