"""The plan calibrated from the jobs that ran (dlcrepro/cluster/calibrate.py): the pilot's jobs, the
projection from their measurements, the calibration file the rules' requests read."""

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SMOKE
from dlcrepro.cluster import (
    calibration_path,
    CalibrationError,
    calibration,
    load_calibration,
    load_merged,
    measurements,
    pilot_cells,
    project,
)
from dlcrepro.cluster.calibrate import PILOT_STEPS, cost_class, phase_counts, phase_rates
from dlcrepro.cluster.cells import grid_cells
from dlcrepro.cluster.resources import job_resources
from dlcrepro.grid import computed_as

REHEARSAL = ROOT / "configs" / "rehearsal.yaml"
PAPER = ROOT / "configs" / "paper.yaml"


@pytest.mark.parametrize("overrides", [{}, {"train.updates_per_batch": 4}])
def test_the_pilot_has_one_cell_of_each_cost_class_each_its_own_computation(overrides):
    cfg = load_merged([str(REHEARSAL)], overrides)
    pilot = pilot_cells(cfg)
    classes = [cost_class(cfg, c.model, c.sampler, c.correction) for c in pilot]
    trained = {cost_class(cfg, c.model, c.sampler, c.correction) for c in grid_cells(cfg) if c.same_as is None}
    assert sorted(classes) == sorted(trained) and len(set(classes)) == len(classes)
    for c in pilot:  # never a copy: its own numbers, on a sampler synced every step
        assert computed_as(c.sampler, c.correction, cfg.train_for(c.model))[0] == c.correction
        assert c.sampler in ("bf16", "fp8")
    # bf16 and fp8, with and without top-k; ppo apart only with several SGD steps per batch
    assert len(pilot) == (6 if overrides else 4), pilot


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
    with pytest.raises(CalibrationError, match=re.escape(str(calibration_path(other, tmp_path))) + ".*plan --config .* --calibrate"):
        load_calibration(other, tmp_path)
    # the plan says so too, in one line, not a traceback
    p = subprocess.run([sys.executable, "-m", "dlcrepro", "plan", "--config", str(REHEARSAL), "--set", f"results_dir={tmp_path}",
                        "--set", "train.steps=16"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "was calibrated for another config" in p.stderr and "Traceback" not in p.stderr, p.stderr


def snakemake(*args, timeout=1800):
    return subprocess.run([sys.executable, "-m", "snakemake", "--nolock", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.snakemake
def test_the_smoke_pilot_then_the_calibrated_plan_and_the_requests_it_gives(tmp_path, smoke_warm_start):
    """The pilot target on the smoke config (real jobs), `plan --calibrate` on its files, and a dry
    run of the grid asking for the calibrated requests."""
    results = tmp_path / "results"
    smoke_warm_start.up_to_date_in(results)
    config = [f"results_dir={results}", f"artifacts={smoke_warm_start.artifacts}", f"python={sys.executable}"]
    p = snakemake("--cores", "2", "--configfile", str(SMOKE), *smoke_warm_start.SNAKEMAKE_ARGS, "--config", *config, "--", "pilot")
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs == {"initial_eval": "1", "rollouts": "2", "pilot_cell": "4", "pilot": "1", "total": "8"}, jobs
    assert not list(results.glob("tiny/*/*/seed0/summary.json"))  # no grid cell: the pilot's are under _pilot/

    cfg = load_merged([str(SMOKE)], {"results_dir": str(results)})
    for c in pilot_cells(cfg):  # what each pilot cell recorded for the calibration
        s = json.loads((results / "_pilot" / c.name / "summary.json").read_text())
        assert s["steps"] == s["steps_timed"] == PILOT_STEPS, s
        assert s["seconds_by_phase"]["eval"] > 0 and s["seconds_by_phase"]["checkpoint"] > 0  # its last step evaluates; ckpt_every 1
        assert s["peak_host_rss_mb"] > 100
        assert s["device_memory"]["torch_max_allocated_bytes"] is None  # a CPU: no device memory
        assert set(s["device_memory"]["engine_kv_cache_bytes"].values()) == {cfg.engine.kv_cache_mib * 2**20}

    measured = measurements(cfg, results)
    assert sorted(r["kind"] for r in measured) == ["initial_eval", "pilot", "pilot", "pilot", "pilot", "rollouts", "rollouts"]
    rates = phase_rates(measured)
    for r in (r for r in measured if r["kind"] == "pilot"):  # the phases add up to the job's wall time, less its fixed part
        k = rates[r["class"]]
        assert k["fixed_s"] > 0 and k["per"]["sample"] > 0 and k["per"]["checkpoint"] > 0
        assert sum(k["per"][p] * r[f"n_{p}"] for p in k["per"] if k["per"][p]) + k["fixed_s"] == pytest.approx(r["wall_s"])

    projected = {(r["kind"], r["name"]): r for r in project(cfg, measured)}
    steps = cfg.train.steps
    for c in grid_cells(cfg):
        row = projected[("copy" if c.same_as else "train", c.name)]
        assert row["source"] == ("assumed" if c.same_as else "projected"), row
    fresh, lagged = projected[("train", "tiny/bf16/pg/seed0")], projected[("train", "tiny/stale/pg/seed0")]
    k = rates[fresh["class"]]
    # a stale cell reads its first steps from the rollouts file: no sampling, no sync (sync_every 64 > steps)
    assert (fresh["minutes"] - lagged["minutes"]) * 60 == pytest.approx(steps * (k["per"]["sample"] + k["per"]["sync"]))
    assert projected[("rollouts", "tiny/stale/seed0")]["source"] == "measured"

    p = subprocess.run([sys.executable, "-m", "dlcrepro", "plan", "--config", str(SMOKE), "--set", f"results_dir={results}",
                        "--calibrate", str(results)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dlcrepro plan, calibrated: smoke" in p.stdout and "projected" in p.stdout
    assert "requests calibrated: " in p.stdout, p.stdout
    cal = json.loads(calibration_path(cfg, results).read_text())
    want = cal["jobs"]["train/tiny/bf16/pg/seed0"]
    assert want["source"] == "projected" and want["runtime"] == 10  # seconds of work: the 10-minute floor, not the default 30

    # the dry run's train job asks for the calibrated memory and runtime
    p = snakemake("-n", "--configfile", str(SMOKE), *smoke_warm_start.SNAKEMAKE_ARGS, "--config", *config, "--",
                  str(results / "tiny" / "bf16" / "pg" / "seed0" / "summary.json"), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    train = (p.stdout + p.stderr).split("rule train:")[1]
    assert f"runtime={want['runtime']}," in train and f"mem_mb={want['mem_mb']}," in train, train[:1500]
