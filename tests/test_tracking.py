"""The trackers (config `tracking`, dlcrepro/core/tracking.py) against the real libraries: a short cell
logs to TensorBoard, W&B (offline) and a real MLflow server, and each logged series is read back
with the library's own reader and compared with the cell's metrics.parquet; a copied cell logs
nothing; a server lost mid-run is reported once and the run finishes."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from conftest import ROOT, SMOKE

from dlcrepro.core import tracking
from dlcrepro.core.config import ConfigError, load, tracking_for_jobs

# scripts/setup.sh installs them (the `tracking` extra); looked up, not imported
pytestmark = pytest.mark.skipif(bool(tracking.missing_packages(list(tracking.BACKENDS))),
                                reason="pip install 'dlcrepro[tracking]'")


def deadline(base_s: float) -> float:
    """`base_s` on an idle machine, stretched by how many runnable processes share each core."""
    return time.monotonic() + base_s * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def wait_for(ready, what: str, base_s: float = 60.0, every_s: float = 0.2):
    """Poll `ready()` until it returns something truthy; fail naming `what` past the deadline."""
    end = deadline(base_s)
    while time.monotonic() < end:
        got = ready()
        if got:
            return got
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


def table_series(metrics: Path) -> dict[str, list[tuple[int, float]]]:
    """Each column of a metrics.parquet as (step, value) pairs, NaN cells left out (as logged)."""
    df = pd.read_parquet(metrics)
    out = {c: [(int(s), float(v)) for s, v in zip(df["step"], df[c]) if not math.isnan(v)] for c in df.columns if c != "step"}
    return {c: s for c, s in out.items() if s}


# ----------------------------------------------------------------------------- the readers


def tensorboard_series(run_dir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    """Scalars and texts of a run directory, read as TensorBoard's server reads them."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    acc.Reload()
    value = lambda e: tensor_util.make_ndarray(e.tensor_proto)  # noqa: E731
    scalars = {t: [(e.step, float(value(e))) for e in acc.Tensors(t)] for t in acc.PluginTagToContent("scalars")}
    texts = {t: value(acc.Tensors(t)[-1]).item().decode() for t in acc.PluginTagToContent("text")}
    return scalars, texts


def wandb_records(run_file: Path):
    """The records of an offline run's `.wandb` file: W&B's transaction log (a `:W&B` header, then
    LevelDB-log blocks of 32 KiB whose records, whole or in pieces, are `Record` protobufs)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += block - pos % block
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run(run_file: Path) -> tuple[dict, dict[str, list[tuple[int, float]]], dict]:
    """(run record: name, group, config; history per key; final summary) of an offline run."""
    run, history, summary = {}, {}, {}
    for r in wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = {"name": r.run.display_name, "group": r.run.run_group, "tags": list(r.run.tags),
                   "config": {u.key: json.loads(u.value_json) for u in r.run.config.update}}
        elif kind == "history":
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):
                    history.setdefault(key, []).append((r.history.step.num, float(json.loads(item.value_json))))
        elif kind == "summary":
            summary |= {u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.summary.update}
    return run, history, summary


# ----------------------------------------------------------------------------- an MLflow server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLflowServer:
    """`mlflow server` on 127.0.0.1 with a SQLite backend store and artifacts in a directory."""

    def __init__(self, root: Path):
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "server.log"
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")]
        # no background job runner: nothing here needs one, and it costs seconds to start
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def healthy(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return urllib.request.urlopen(f"{self.uri}/health", timeout=2).status == 200
        except OSError:
            return False

    def wait(self) -> "MLflowServer":
        wait_for(self.healthy, f"the MLflow server on port {self.port}", base_s=120)
        return self

    def kill(self) -> None:
        """The server and its workers (its own process group), at once, as a lost node would be."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """Started first and waited for inside the tests, so that it boots while the model warm-starts."""
    server = MLflowServer(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.kill()


def client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


# ----------------------------------------------------------------------------- config


def test_a_tracker_that_is_not_installed_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # how Python marks a module that cannot be imported
    with pytest.raises(ConfigError,
                       match=r"tracking\.backends names wandb \(package wandb\), not installed.*dlcrepro\[tracking\]"):
        load(SMOKE, {"tracking.backends": ["tensorboard", "wandb"]})


def test_an_unknown_tracker_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown tracker 'tensorbaord'; known: \['tensorboard', 'wandb', 'mlflow'\]"):
        load(SMOKE, {"tracking.backends": ["tensorbaord"]})


def test_no_tracker_is_imported_until_a_run_starts_one():
    code = ("import sys; from dlcrepro.core.config import load; from dlcrepro.core import tracking; "
            f"load({str(SMOKE)!r}, {{'tracking.backends': ['tensorboard', 'wandb', 'mlflow']}}); "
            "print(sorted(m for m in ('tensorboard', 'wandb', 'mlflow', 'torch') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr[-2000:]


def test_the_workflow_hands_jobs_the_section_with_its_directories_under_the_results(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    section = json.loads(tracking_for_jobs({"backends": ["wandb", "mlflow"]}, "res", "tiny"))
    res = Path("res").resolve()
    assert section["project"] == "dlcrepro-tiny" and section["wandb_dir"] == str(res / "_wandb")
    assert section["mlflow_uri"] == f"sqlite:///{res / '_mlflow.db'}" and section["tensorboard_dir"] == str(res / "_tensorboard")
    assert tracking_for_jobs({"backends": []}, "res", "tiny") is None  # the tiny study: no tracker, no variable


def test_a_resumed_run_replaces_the_steps_it_takes_again_in_tensorboard(tmp_path):
    """A run killed after step 3 and resumed from its checkpoint at step 2 logs steps 3 and 4 again:
    TensorBoard shows the second try's step 3, once."""
    cfg = load(SMOKE, {"tracking.backends": ["tensorboard"], "tracking.tensorboard_dir": str(tmp_path)})
    cell = {"model": "tiny", "sampler": "stale", "correction": "dlc", "seed": 0}
    for first, steps in ((1, (1, 2, 3)), (3, (3, 4))):
        trackers = tracking.open_trackers(cfg, tmp_path / "cell", lambda msg: None, first_step=first)
        trackers.start(cell, {"train.lr": 0.3})
        for s in steps:
            trackers.log(s, {"step": s, "reward_mean": s + first / 10})
        trackers.finish({"steps": steps[-1]} if first == 3 else None)
    scalars, texts = tensorboard_series(tmp_path / "tiny" / "stale" / "dlc" / "seed0")
    assert scalars == {"reward_mean": [(1, 1 + 1 / 10), (2, 2 + 1 / 10), (3, 3 + 3 / 10), (4, 4 + 3 / 10)]}
    assert "train.lr: 0.3" in texts["config/text_summary"] and '"steps": 4' in texts["summary/text_summary"]


# ----------------------------------------------------------------------------- one cell, every tracker


def train_script(cells: list[tuple[str, str]], model_dir: Path, results: Path, sets: tuple[str, ...] = ()) -> list[str]:
    """`python -m dlcrepro train` of each (sampler, correction) cell into the grid's layout under
    `results`, in one process (the engines are imported once)."""
    runs = [["train", "--config", str(SMOKE), "--model-dir", str(model_dir), "--sampler", s, "--correction", c, "--seed", "0",
             "--out", str(results / "tiny" / s / c / "seed0"), *[a for kv in sets for a in ("--set", kv)]] for s, c in cells]
    code = f"from dlcrepro.run.cli import main\nfor argv in {runs!r}:\n    assert main(argv) == 0\n"
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_each_step_reaches_every_tracker_under_the_glossary_names_and_a_copy_logs_nothing(mlflow_server, tiny_model_dir,
                                                                                          tmp_path):
    results = tmp_path / "results"
    # as the workflow hands it to its jobs: the study's section in the environment
    section = tracking_for_jobs({"backends": ["tensorboard", "wandb", "mlflow"], "project": "watch",
                                 "mlflow_uri": mlflow_server.uri},
                                str(results), "smoke")
    env = {**os.environ, tracking.ENV: section, "WANDB_MODE": "offline"}
    mlflow_server.wait()
    # bf16/ppo is bf16/pg's run (one SGD step per batch): copied, not trained (dlcrepro/core/grid.py)
    p = subprocess.run(train_script([("bf16", "pg"), ("bf16", "ppo")], tiny_model_dir, results),
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    cell = results / "tiny" / "bf16" / "pg" / "seed0"
    want = {tracking.tracker_key(c): series for c, series in table_series(cell / "metrics.parquet").items()}
    summary = json.loads((cell / "summary.json").read_text())
    assert {"reward_mean", "ess_lag", "dev_ratio", "test_accuracy", "sec_sample", "mismatch/total/k3_kl",
            "mismatch/discrepancy/k3_kl", "mismatch/lag/k3_kl"} <= set(want)

    # TensorBoard: one directory per run, <model>/<sampler>/<correction>/seed<k>, under the results
    board = results / "_tensorboard"
    assert [d.relative_to(board) for d in board.glob("*/*/*/*")] == [Path("tiny/bf16/pg/seed0")]
    scalars, texts = tensorboard_series(results / "_tensorboard" / "tiny" / "bf16" / "pg" / "seed0")
    assert scalars == want
    assert "train.lr: 0.3" in texts["config/text_summary"]
    assert f'"final_test_accuracy": {summary["final_test_accuracy"]}' in texts["summary/text_summary"]

    # W&B: one offline run, named and grouped by its cell, the config as its parameters
    (run_file,) = (results / "_wandb").glob("wandb/offline-run-*/run-*.wandb")
    run, history, wb_summary = wandb_run(run_file)
    assert run["name"] == "tiny/bf16/pg/seed0" and run["group"] == "tiny/bf16/pg" and run["tags"] == ["tiny", "bf16", "pg"]
    assert run["config"]["train.lr"] == 0.3 and run["config"]["sampler"] == "bf16"
    assert run["config"]["models.tiny.arch.hidden_size"] == 128
    assert history == want
    assert wb_summary["final_test_accuracy"] == summary["final_test_accuracy"]

    # MLflow, read back from the server with its client
    c = client(mlflow_server.uri)
    (mrun,) = c.search_runs([c.get_experiment_by_name("watch").experiment_id])
    assert mrun.info.run_name == "tiny/bf16/pg/seed0" and mrun.info.status == "FINISHED"
    assert mrun.data.tags["group"] == "tiny/bf16/pg" and mrun.data.params["train.lr"] == "0.3"
    logged = {k: [(m.step, m.value) for m in c.get_metric_history(mrun.info.run_id, k)]
              for k in mrun.data.metrics if not k.startswith("summary.")}
    assert logged == want
    assert mrun.data.metrics["summary.final_test_accuracy"] == summary["final_test_accuracy"]
    artifact = Path(c.download_artifacts(mrun.info.run_id, "summary.json", str(tmp_path)))
    assert json.loads(artifact.read_text())["steps"] == summary["steps"]

    # the copy: logged once, as its twin, and it says so
    copy = results / "tiny" / "bf16" / "ppo" / "seed0"
    assert ("tracking: not logged to tensorboard, wandb, mlflow: this cell is the run logged there as tiny/bf16/pg/seed0"
            in (copy / "train.log").read_text())
    assert (json.loads((copy / "summary.json").read_text())["tracking"]
            == "not logged: this cell is the run logged as tiny/bf16/pg/seed0")
    assert summary["tracking"]["mlflow"].startswith("logged as tiny/bf16/pg/seed0 (run id ")


@pytest.mark.slow
def test_a_tracker_that_loses_its_server_mid_run_is_reported_once_and_the_run_finishes(mlflow_server, tiny_model_dir, tmp_path):
    """Runs after the test above: it kills the module's server."""
    results = tmp_path / "results"
    steps = 6
    sets = ("tracking.backends=[mlflow]", "tracking.project=lost", f"tracking.mlflow_uri={mlflow_server.uri}",
            f"train.steps={steps}")
    mlflow_server.wait()
    job = subprocess.Popen(train_script([("stale", "pg")], tiny_model_dir, results, sets), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    c = client(mlflow_server.uri)

    def first_step_logged():
        exp = c.get_experiment_by_name("lost")
        runs = c.search_runs([exp.experiment_id]) if exp else []
        return runs and c.get_metric_history(runs[0].info.run_id, "reward_mean")

    try:
        wait_for(first_step_logged, "the run's first step in MLflow", base_s=300, every_s=0.1)
    finally:
        mlflow_server.kill()
    out, err = job.communicate(timeout=900)
    assert job.returncode == 0, err[-4000:]
    cell = results / "tiny" / "stale" / "pg" / "seed0"
    assert list(pd.read_parquet(cell / "metrics.parquet")["step"]) == list(range(1, steps + 1))  # the record is whole
    failures = [line for line in (cell / "train.log").read_text().splitlines() if "tracking: mlflow failed" in line]
    assert len(failures) == 1 and "logs no more in this run" in failures[0], failures
    status = json.loads((cell / "summary.json").read_text())["tracking"]["mlflow"]
    assert status.startswith("failed at step ") and int(status.split()[3].rstrip(":")) < steps, status


def test_a_mismatch_part_reaches_a_tracker_nested_as_the_frameworks_keys_and_every_other_column_by_its_name():
    from dlcrepro.step import diagnostics

    parts = [p for p, _, _ in diagnostics.MISMATCH_PARTS]
    assert tracking.NESTED == tuple(f"mismatch_{p}_" for p in parts)
    keys = {c: tracking.tracker_key(c) for c in diagnostics.metric_columns()}
    assert keys["mismatch_total_k3_kl"] == "mismatch/total/k3_kl"
    assert keys["mismatch_discrepancy_train_rollout_logprob_abs_diff"] == "mismatch/discrepancy/train_rollout_logprob_abs_diff"
    assert keys["mismatch_lag_log_ppl_diff_max"] == "mismatch/lag/log_ppl_diff_max"
    assert all(k == c for c, k in keys.items() if not c.startswith("mismatch_"))  # discrepancy_mean stays itself
    assert len(set(keys.values())) == len(keys)
    assert tracking.step_values({"step": 3, "mismatch_lag_kl": 0.5, "dev": math.nan, "lag_mean": 0.1}) == {
        "mismatch/lag/kl": 0.5, "lag_mean": 0.1}


def test_the_workflow_schema_knows_the_same_trackers():
    import yaml

    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["properties"]["tracking"]["properties"]["backends"]["items"]["enum"] == list(tracking.BACKENDS)


def test_a_finished_run_is_still_copied_after_the_trackers_change(tmp_path, smoke_cfg):
    """Where a study is watched is no part of what it computes: a copy still finds its twin."""
    import dataclasses

    import yaml

    from dlcrepro.core.config import to_dict
    from dlcrepro.study.celldir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, finished_as

    meta = {"model": "tiny", "sampler": "stale", "correction": "pg", "seed": 0, "model_dir": "m"}
    (tmp_path / METRICS_FILE).write_bytes(b"x")
    (tmp_path / SUMMARY_FILE).write_text("{}")
    (tmp_path / CONFIG_FILE).write_text(yaml.safe_dump({"cell": meta, "config": to_dict(smoke_cfg)}, sort_keys=False))
    watched = dataclasses.replace(smoke_cfg, tracking=dataclasses.replace(smoke_cfg.tracking, backends=["tensorboard"]))
    assert finished_as(tmp_path, meta, watched)


@pytest.mark.slow
def test_jobs_starting_together_on_a_new_mlflow_database_both_log(tmp_path):
    """The workflow's two local jobs open the default SQLite file at once: MLflow migrates a new
    one on opening, which only one may do; both runs must still be logged."""
    db = tmp_path / "_mlflow.db"
    code = f"""
import sys
from dlcrepro.core import tracking
from dlcrepro.core.config import load
cfg = load({str(SMOKE)!r},
           {{"tracking.backends": ["mlflow"], "tracking.mlflow_uri": "sqlite:///{db}", "tracking.project": "both"}})
cell = {{"model": "tiny", "sampler": "stale", "correction": sys.argv[1], "seed": 0}}
t = tracking.open_trackers(cfg, {str(tmp_path)!r} + "/" + sys.argv[1], print, first_step=1)
t.start(cell, {{"train.lr": 0.3}})
t.log(1, {{"step": 1, "reward_mean": 0.5}})
t.finish({{"steps": 1}})
assert "failed" not in str(t.status), t.status
"""
    jobs = [subprocess.Popen([sys.executable, "-c", code, c], cwd=ROOT, stderr=subprocess.PIPE, text=True) for c in ("pg", "dlc")]
    for job in jobs:
        assert job.wait(timeout=600) == 0, job.stderr.read()[-3000:]
    c = client(f"sqlite:///{db}")
    runs = c.search_runs([c.get_experiment_by_name("both").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["tiny/stale/dlc/seed0", "tiny/stale/pg/seed0"]
    assert all(r.data.metrics["reward_mean"] == 0.5 for r in runs)
