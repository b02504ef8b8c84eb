"""The batch-size scan: the fit of M − 1 = β·T on synthetic numbers, and one smoke-sized scan end to end."""

import time

import numpy as np
import pandas as pd
import pytest

from dlcrepro.study.scan import RAW_FILE, fit_slope, paper_batch_tokens, scaling_fit

LADDER = (1000, 2000, 4000, 8000, 16000)  # tokens per batch


def synthetic(beta: float, seed: int, reps: int = 16, shape: float = 20.0, v: float = 1.0):
    """Per rung, `reps` repetitions of floor = (2v/T)·G and dev = 2vβ + (2v/T)·G′ (G, G′ ~ Gamma with
    mean 1): E dev / E floor = 1 + β·T exactly. T varies ±5 % between repetitions."""
    rng = np.random.default_rng(seed)
    tokens, devs, floors = [], [], []
    for t in LADDER:
        tt = t * rng.uniform(0.95, 1.05, reps)
        tokens.append(tt)
        floors.append(2 * v / tt * rng.gamma(shape, 1 / shape, reps))
        devs.append(2 * v * beta + 2 * v / tt * rng.gamma(shape, 1 / shape, reps))
    return tokens, devs, floors


def test_fit_through_the_origin_is_exact_on_exact_numbers():
    t = np.array([100.0, 200.0, 400.0])
    beta, resid = fit_slope(t, 1 + 3e-3 * t, np.ones(3))
    assert beta == pytest.approx(3e-3) and np.allclose(resid, 0)


def test_a_rung_without_a_floor_is_left_out_of_the_fit():
    t = np.array([100.0, 200.0, 400.0])
    beta, resid = fit_slope(t, [1 + 0.1, 123.0, 1 + 0.4], [1.0, 0.0, 1.0])
    assert beta == pytest.approx(1e-3) and np.isnan(resid[1])


def test_known_slope_is_recovered_within_its_interval():
    beta = 1e-4
    f = scaling_fit(*synthetic(beta, seed=0), t_star=153_600, n_boot=1000)
    assert f["beta_low"] <= beta <= f["beta_high"]
    assert f["beta"] == pytest.approx(beta, rel=0.2) and f["beta_low"] > 0
    assert f["multiple_at_t_star"] == pytest.approx(1 + f["beta"] * 153_600)
    assert f["multiple_at_t_star_low"] <= f["multiple_at_t_star"] <= f["multiple_at_t_star_high"]
    assert np.all(f["multiple_low"] <= f["multiple"]) and np.all(f["multiple"] <= f["multiple_high"])


def test_interval_covers_the_true_slope_in_most_independent_scans():
    beta = 1e-4
    fits = (scaling_fit(*synthetic(beta, s), 1e5, n_boot=500, seed=s) for s in range(40))
    hits = [f["beta_low"] <= beta <= f["beta_high"] for f in fits]
    assert np.mean(hits) >= 0.8  # nominal 95 %; the percentile bootstrap of 16 repetitions runs ~90 %


def test_unbiased_correction_has_a_slope_interval_containing_zero():
    f = scaling_fit(*synthetic(0.0, seed=1), t_star=153_600, n_boot=1000)
    assert f["beta_low"] <= 0 <= f["beta_high"]
    assert abs(f["beta"]) * LADDER[-1] < 0.2  # M within 20 % of the floor even at the largest batch


def test_paper_batch_reads_paper_yaml_and_states_the_assumed_length():
    t_star, text = paper_batch_tokens()
    assert t_star == 64 * 8 * 300 and "assumed" in text
    assert paper_batch_tokens(100)[0] == 64 * 8 * 100


@pytest.mark.engine
def test_smoke_scan_writes_table_parquet_and_figure(tiny_model_dir, smoke_cfg, tmp_path):
    from dlcrepro.run.cli import main

    out = tmp_path / "scan"
    t0 = time.perf_counter()
    status = main(["scan", "--config", "configs/smoke.yaml", "--model-dir", str(tiny_model_dir), "--sampler", "bf16",
                   "--corrections", "pg", "--prompts", "2", "4", "--reps", "2", "--n-boot", "200", "--out", str(out)])
    seconds = time.perf_counter() - t0
    assert status == 0
    raw = pd.read_parquet(out / RAW_FILE)
    assert len(raw) == 2 * 2 and set(raw["prompts"]) == {2, 4}
    assert (raw["responses"] == smoke_cfg.train.responses_per_prompt).all()
    assert (raw["floor"] >= 0).all() and (raw["dev"] >= 0).all() and (raw["tokens"] > 0).all()
    assert raw["step"].eq(0).all() and raw["theta"].eq("warm start").all()
    for name in ("scaling.csv", "scaling.md", "scaling_fit.csv", "scaling.png", "scaling.pdf"):
        assert (out / name).stat().st_size > 0, name
    table = pd.read_csv(out / "scaling.csv")
    assert list(table["batch"]) == ["2 x 4", "4 x 4", "T* (extrapolated)"]
    # redraw from the parquet alone, elsewhere
    assert main(["scan", "--redraw", str(out / RAW_FILE), "--n-boot", "200", "--out", str(tmp_path / "redraw"), "--name",
                 "again"]) == 0
    assert (tmp_path / "redraw" / "again.csv").read_text() == (out / "scaling.csv").read_text()
    assert (tmp_path / "redraw" / "again.png").stat().st_size > 0
    print(f"smoke scan: {seconds:.1f} s")


@pytest.mark.engine
def test_lagged_sampler_at_a_checkpoint_samples_from_the_checkpoints_sampler(tiny_model_dir, smoke_cfg, tmp_path):
    from dlcrepro.study.scan import scan
    from dlcrepro.step.train import Cell, PhaseTimer, Trainer

    tr = Trainer(smoke_cfg, "tiny", "stale", "pg", 0, tiny_model_dir)  # two steps of a stale run: θ_t moves, θ_s stays θ_0
    cell = Cell()
    tr.start_engines(cell)
    for _ in range(2):
        tr.step(cell, PhaseTimer())
    tr.save_checkpoint(tmp_path / "checkpoint.pt", cell)
    raw = scan(smoke_cfg, "tiny", "stale", ["pg", "is"], [2], 2, model_dir=tiny_model_dir, checkpoint=tmp_path / "checkpoint.pt")
    assert raw["theta"].eq("step 2").all() and raw["step"].eq(2).all() and raw["sampler_version"].eq(0).all()
    assert (raw["lag_mean_abs"] > 0).all() and (raw["kl_sampler"] > 0).all()  # the trainer's θ_s is not its θ_t
