"""The plan calibrated from the jobs that ran (dlcrepro/cluster/calibrate.py): the pilot's jobs, the
projection from their measurements, the calibration file the rules' requests read. The smoke pilot
itself, its calibrated plan and the projection's error on the grid that runs after it are part of
the smoke pipeline's test (tests/test_workflow.py)."""

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from dlcrepro.cluster import (
    calibration_path,
    CalibrationError,
    calibration,
    load_calibration,
    load_merged,
    pilot_cells,
    project,
    projection_error_totals,
    projection_errors,
)
from dlcrepro.cluster.calibrate import cost_class, measurements, phase_counts, phase_rates
from dlcrepro.cluster.cells import grid_cells
from dlcrepro.cluster.resources import job_resources
from dlcrepro.core.grid import computed_as
from dlcrepro.core.phases import PHASES

REHEARSAL = ROOT / "configs" / "rehearsal.yaml"
PAPER = ROOT / "configs" / "paper.yaml"


WITH_PPO = {"grid.corrections": ["pg", "center", "is", "is_center", "ppo", "dlc", "is_resync"]}


@pytest.mark.parametrize("overrides, n", [({}, 6), (WITH_PPO, 4), ({**WITH_PPO, "train.updates_per_batch": 4}, 6)])
def test_the_pilot_has_one_cell_of_each_cost_class_each_its_own_computation(overrides, n):
    cfg = load_merged([str(REHEARSAL)], overrides)
    pilot = pilot_cells(cfg)
    classes = [cost_class(cfg, c.model, c.sampler, c.correction) for c in pilot]
    trained = {cost_class(cfg, c.model, c.sampler, c.correction) for c in grid_cells(cfg) if c.same_as is None}
    assert sorted(classes) == sorted(trained) and len(set(classes)) == len(classes)
    for c in pilot:  # never a copy: its own numbers, on a sampler synced every step
        assert computed_as(c.sampler, c.correction, cfg.train_for(c.model))[0] == c.correction
        assert c.sampler in ("bf16", "fp8")
    # bf16 and fp8, with and without top-k; ppo_multi apart, ppo only with several SGD steps per batch
    assert len(pilot) == n, pilot


def test_a_lagged_cell_pays_sampling_and_syncs_only_after_its_shared_steps():
    cfg = load_merged([str(PAPER)], {"train.sync_every": 16})
    fresh, lagged = (phase_counts(cfg, "qwen3-0.6b", s, 40) for s in ("bf16", "stale"))
    assert fresh["sample"] == fresh["sync"] == 40 and lagged["sample"] == lagged["sync"] == 40 - 16
    assert fresh["eval"] == lagged["eval"] == 4 and fresh["checkpoint"] == 7  # eval_every 10; ckpt_every 5, not after the last
    assert phase_counts(cfg, "qwen3-0.6b", "bf16", 40, first=31)["eval"] == 1  # a resumed run times steps 31-40


def test_job_resources_read_the_calibration_and_double_the_runtime_at_each_retry():
    cfg = load_merged([str(PAPER)])
    cal = {"jobs": {"train/qwen3-0.6b/bf16/pg/seed0": {"runtime": 40, "mem_mb": 30000},
                    "initial_eval/qwen3-0.6b/seed0": {"runtime": 10, "mem_mb": 20000}}}
    assert job_resources(cfg, "qwen3-0.6b", "train", "bf16", cal, "qwen3-0.6b/bf16/pg/seed0") == {
        "gpu": 1, "runtime": 40, "mem_mb": 30000, "cpus_per_task": 8}
    assert job_resources(cfg, "qwen3-0.6b", "train", "bf16", cal, "qwen3-0.6b/bf16/pg/seed0", attempt=3)["runtime"] == 160
    assert job_resources(cfg, "qwen3-0.6b", "initial_eval", None, cal, "qwen3-0.6b/seed0")["mem_mb"] == 20000
    # a job the calibration does not hold asks for the uncalibrated request
    assert job_resources(cfg, "qwen3-0.6b", "train", "fp8", cal, "qwen3-0.6b/fp8/pg/seed0") == job_resources(cfg, "qwen3-0.6b")
    assert job_resources(cfg, "qwen3-0.6b", attempt=2)["runtime"] == 2 * job_resources(cfg, "qwen3-0.6b")["runtime"]


def test_a_calibration_of_another_config_is_refused_naming_the_file_and_the_fix(tmp_path):
    cfg = load_merged([str(REHEARSAL)], {"results_dir": str(tmp_path)})
    assert load_calibration(cfg, tmp_path) is None
    calibration_path(cfg, tmp_path).write_text(json.dumps(calibration(cfg, [], str(tmp_path))))
    assert load_calibration(cfg, tmp_path)["jobs"] == {}
    other = load_merged([str(REHEARSAL)], {"results_dir": str(tmp_path), "train.steps": 16})
    with pytest.raises(CalibrationError,
                       match=re.escape(str(calibration_path(other, tmp_path))) + ".*plan --config .* --calibrate"):
        load_calibration(other, tmp_path)
    # the plan says so too, in one line, not a traceback
    p = subprocess.run([sys.executable, "-m", "dlcrepro", "plan", "--config", str(REHEARSAL), "--set", f"results_dir={tmp_path}",
                        "--set", "train.steps=16"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "was calibrated for another config" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_the_start_up_is_projected_as_the_pilot_started_and_set_apart_in_the_error():
    """A pilot cell forked from the fork server (start-up ~0) projects a grid cell; the grid cell
    then runs in its own process (10 s of imports first): its wall-time error is the executor's,
    its work error the cost model's."""
    cfg = load_merged([str(PAPER)])
    pilot = pilot_cells(cfg)[0]
    counts = phase_counts(cfg, pilot.model, pilot.sampler, 2, 1, {"ckpt_every": 1})
    ran = {"kind": "pilot", "name": pilot.name, "class": cost_class(cfg, pilot.model, pilot.sampler, pilot.correction),
           "steps": 2,
           "wall_s": 30.0, "peak_host_mb": 1000.0, "torch_peak_bytes": None, "kv_cache_bytes": None,
           "process": "fork server child", "startup_s": 0.5, "seconds": dict.fromkeys(PHASES, 1.0), "counts": counts}
    rows = {(r["kind"], r["name"]): r for r in project(cfg, [ran])}
    cell = f"{pilot.model}/{pilot.sampler}/{pilot.correction}/seed0"
    grid = rows[("train", cell)]
    assert grid["source"] == "projected" and grid["startup_s"] == 0.5 and "start-up as a fork server child" in grid["basis"]
    cal = calibration(cfg, list(rows.values()), "results")
    assert cal["jobs"][f"train/{cell}"]["startup_s"] == 0.5
    work = 60 * cal["jobs"][f"train/{cell}"]["minutes"] - 0.5
    measured = {**ran, "kind": "train", "name": cell, "wall_s": 10.0 + work * 1.1, "process": "own process", "startup_s": 10.0}
    (e,) = projection_errors(cal, [measured])
    assert e["process"] == "own process" and e["work_error"] == pytest.approx(1 / 1.1 - 1)
    assert e["error"] < e["work_error"]  # the wall time holds the 10 s of imports the projection did not
    totals = projection_error_totals([e])
    assert totals["cells"] == totals["work_cells"] == 1 and totals["work_total"] == pytest.approx(e["work_error"])


def test_a_trained_cells_measurement_holds_its_seconds_and_counts_by_phase(tmp_path):
    cfg = load_merged([str(PAPER)])
    c = next(c for c in grid_cells(cfg) if c.same_as is None and c.sampler == "bf16")
    steps = cfg.train_for(c.model).steps
    (tmp_path / c.name).mkdir(parents=True)
    (tmp_path / c.name / "summary.json").write_text(json.dumps({
        "steps": steps, "wall_seconds": 100.0, "seconds_by_phase": dict.fromkeys(PHASES, 2.0), "process": "own process",
        "startup_seconds": 5.0}))
    (row,) = measurements(cfg, tmp_path)
    assert (row["kind"], row["name"], row["wall_s"], row["startup_s"]) == ("train", c.name, 100.0, 5.0)
    assert row["seconds"] == dict.fromkeys(PHASES, 2.0) and row["counts"] == phase_counts(cfg, c.model, c.sampler, steps)
    assert phase_rates([row])[row["class"]]["per"]["eval"] == 2.0 / row["counts"]["eval"]
