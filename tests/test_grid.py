"""Cells that compute another cell's numbers bit for bit (dlcrepro/core/grid.py): the rule, the proof
by running both, and the copy that replaces the second run."""

import dataclasses
import json
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import ROOT, SMOKE
from dlcrepro.core.config import TrainConfig, to_dict
from dlcrepro.core import grid
from dlcrepro.core.grid import SAMPLERS, Sampler, computed_as
from dlcrepro.core.registry import CORRECTION_INFO

CORRECTIONS = list(CORRECTION_INFO)  # every registered correction: a new one is checked too


def same_as_map(train: TrainConfig) -> dict[str, dict[str, str]]:
    return {s: {c: computed_as(s, c, train)[0] for c in CORRECTIONS} for s in SAMPLERS}


def test_the_grid_module_imports_without_torch():
    # the Snakefile imports it from a Snakemake env that may have no torch
    code = ("import sys, dlcrepro.core.grid, dlcrepro.core.config, dlcrepro.core.registry; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_the_schemas_sampler_enum_is_the_registry():
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["properties"]["grid"]["properties"]["samplers"]["items"]["enum"] == list(SAMPLERS)


def test_a_samplers_properties_are_the_registrys():
    assert grid.lagged_samplers() == ("stale", "fp8_stale")
    assert [s.name for s in SAMPLERS.values() if s.is_probe_engine] == ["bf16"] == [grid.probe_engine_sampler()]
    assert len({s.colour for s in SAMPLERS.values()}) == len(SAMPLERS)


def test_a_sampler_registered_without_a_colour_gets_one_of_its_own(monkeypatch):
    monkeypatch.setattr(grid, "SAMPLERS", dict(SAMPLERS))
    fifth = grid.register_sampler(Sampler("fp8_lagged_more", "fp8", False))
    assert fifth.colour and fifth.colour not in {s.colour for n, s in grid.SAMPLERS.items() if n != fifth.name}
    assert fifth.colour not in ("k", "#000000") and grid.lagged_samplers()[-1] == "fp8_lagged_more"


def test_which_cells_are_another_cells_run():
    m = same_as_map(TrainConfig())
    for s in ("bf16", "fp8"):  # synced before every step: no lag
        assert m[s] == {**{c: c for c in CORRECTIONS}, "ppo": "pg", "dlc": "is_center", "is_resync": "is"}
    for s in ("stale", "fp8_stale"):  # lagged: only PPO's single update makes it pg
        assert m[s] == {**{c: c for c in CORRECTIONS}, "ppo": "pg"}
    # several updates per batch: θ moves, the PPO ratio leaves 1; ppo_multi and gspo take their own 4
    assert same_as_map(TrainConfig(updates_per_batch=2))["stale"]["ppo"] == "ppo"
    assert m["bf16"]["ppo_multi"] == "ppo_multi" and m["stale"]["ppo_multi"] == "ppo_multi" and m["bf16"]["gspo"] == "gspo"
    # a clip below 1 clips the lag ratio of 1: dlc would down-weight every token
    assert same_as_map(TrainConfig(clip_c=0.5))["fp8"]["dlc"] == "dlc"
    why = computed_as("fp8", "dlc", TrainConfig())[1]
    # a correction's SGD steps per batch: ppo train.updates_per_batch, ppo_multi and gspo their own, pg one
    from dlcrepro.core.registry import updates_per_batch

    for train in (TrainConfig(), TrainConfig(updates_per_batch=3)):
        assert updates_per_batch("ppo", train) == updates_per_batch("icepop", train) == train.updates_per_batch
        assert updates_per_batch("ppo_multi", train) == updates_per_batch("gspo", train) == 4
        assert updates_per_batch("pg", train) == updates_per_batch("geo_rs", train) == 1
    assert "θ_s = θ_t" in why


@pytest.mark.slow
def test_equal_cells_give_identical_metrics_and_the_second_is_a_copy(tiny_model_dir, tmp_path):
    pairs = [("stale", "pg", "ppo"), ("fp8", "is_center", "dlc"), ("fp8", "is", "is_resync")]
    # Each cell computed in full: the first of a pair where the grid keeps it, the second outside the
    # grid's layout (so nothing is copied); then the second again inside the layout, which copies.
    script = f"""
from pathlib import Path
from dlcrepro.core.config import load
from dlcrepro.study.celldir import run_cell
cfg = load({str(SMOKE)!r})
root = Path({str(tmp_path)!r})
for sampler, first, second in {pairs!r}:
    run_cell(cfg, "tiny", sampler, first, 0, root / "tiny" / sampler / first / "seed0", {str(tiny_model_dir)!r})
    run_cell(cfg, "tiny", sampler, second, 0, root / "computed" / f"{{sampler}}-{{second}}", {str(tiny_model_dir)!r})
    run_cell(cfg, "tiny", sampler, second, 0, root / "tiny" / sampler / second / "seed0", {str(tiny_model_dir)!r})
"""
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    for sampler, first, second in pairs:
        src = tmp_path / "tiny" / sampler / first / "seed0"
        computed = pd.read_parquet(tmp_path / "computed" / f"{sampler}-{second}" / "metrics.parquet")
        ref = pd.read_parquet(src / "metrics.parquet")
        cols = [c for c in ref.columns if not c.startswith("sec_")]
        pd.testing.assert_frame_equal(ref[cols], computed[cols], check_exact=True)
        assert ref["floor"].gt(0).any() and ref["dev"].notna().any()  # a real run, not an empty table
        copy = tmp_path / "tiny" / sampler / second / "seed0"
        assert (copy / "metrics.parquet").read_bytes() == (src / "metrics.parquet").read_bytes()
        summary = json.loads((copy / "summary.json").read_text())
        assert summary["correction"] == second and summary["computed_as"] == str(src)
        assert summary["why"] and summary["wall_seconds"] < 5
        assert "not recomputed" in (copy / "train.log").read_text()


def test_a_source_run_under_another_config_is_not_copied(tmp_path, smoke_cfg):
    from dlcrepro.study.celldir import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, finished_as

    meta = {"model": "tiny", "sampler": "stale", "correction": "pg", "seed": 0, "model_dir": "m"}
    src = tmp_path / "pg"
    src.mkdir()
    (src / METRICS_FILE).write_bytes(b"x")
    (src / SUMMARY_FILE).write_text("{}")
    (src / CONFIG_FILE).write_text(yaml.safe_dump({"cell": meta, "config": to_dict(smoke_cfg)}, sort_keys=False))
    assert finished_as(src, meta, smoke_cfg)
    other = dataclasses.replace(smoke_cfg, train=dataclasses.replace(smoke_cfg.train, lr=smoke_cfg.train.lr / 2))
    assert not finished_as(src, meta, other)
    assert not finished_as(src, {**meta, "seed": 1}, smoke_cfg)
    (src / SUMMARY_FILE).unlink()  # unfinished
    assert not finished_as(src, meta, smoke_cfg)
