"""Aggregates on hand-made metrics tables whose answers are known."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from dlcrepro.report import analysis as A
from dlcrepro.report import tables as T

NAN = math.nan


def run_rows(model, sampler, correction, seed, **cols):
    n = len(next(iter(cols.values())))
    base = dict(model=model, sampler=sampler, correction=correction, seed=seed, step=list(range(1, n + 1)))
    defaults = dict(dev=[1.0] * n, floor=[1.0] * n, ess_lag=[1.0] * n, ess_lag_presync=[NAN] * n, ess_lag_gauss=[1.0] * n,
                    test_accuracy=[NAN] * n, off_support=[0.0] * n, kl_sampler=[0.0] * n, resync=[0] * n)
    df = pd.DataFrame({**base, **defaults, **cols})
    df["dev_ratio"] = np.where(df["floor"] > 0, df["dev"] / df["floor"].where(df["floor"] > 0), np.nan)
    return df


def test_collect_records_how_test_accuracy_was_measured(tmp_path):
    """The runs table says what test_accuracy measures, from the config.yaml the cell wrote (the
    model's train overrides applied); a cell without that file leaves the columns out."""
    cell = tmp_path / "m" / "stale" / "is" / "seed0"
    cell.mkdir(parents=True)
    run_rows("m", "stale", "is", 0, dev=[1.0]).drop(columns=A.RUN).to_parquet(cell / "metrics.parquet")
    summary = dict(model="m", sampler="stale", correction="is", seed=0, final_test_accuracy=0.5, resync_steps=[])
    (cell / "summary.json").write_text(json.dumps(summary))
    config = {"train": {"eval_on": "pool", "eval_mode": "greedy", "eval_samples": 8, "pool_size": 0},
              "task": {"n_train": 100, "n_test": 32}, "models": {"m": {"train": {"pool_size": 64, "eval_mode": "sampled"}}}}
    (cell / "config.yaml").write_text(yaml.safe_dump({"cell": {}, "config": config}))
    _, runs = A.collect([cell / "summary.json"])
    assert runs.loc[0, ["eval_on", "eval_mode", "eval_samples", "eval_problems"]].tolist() == ["pool", "sampled", 8, 64]
    (cell / "config.yaml").unlink()
    assert "eval_on" not in A.collect([cell / "summary.json"])[1]


def test_noise_floor_multiple_is_ratio_of_sums_and_nan_without_floor():
    steps = pd.concat([
        run_rows("m", "stale", "is", 0, dev=[1.0, 2.0, 9.0], floor=[1.0, 1.0, 1.0]),
        run_rows("m", "stale", "pg", 0, dev=[1.0, 2.0, 9.0], floor=[0.0, 0.0, 0.0]),
        # a zero floor (every advantage 0) adds nothing to either sum: its dev of 5 is not counted
        run_rows("m", "stale", "dlc", 0, dev=[1.0, 5.0, 1.0], floor=[1.0, 0.0, 1.0]),
    ])
    m = A.noise_floor_multiple(steps).set_index("correction")["noise_floor_multiple"]
    assert m["is"] == 4.0 and math.isnan(m["pg"]) and m["dlc"] == 1.0


def test_leave_floor_step_uses_trailing_three_step_average_above_two():
    # ratios 1, 1, 5 -> MA 1, 1, 2.33: leaves at step 3; ratios 1, 3, 1, 1 -> MA 1, 2, 1.67, 1.67: never
    steps = pd.concat([
        run_rows("m", "stale", "is", 0, dev=[1.0, 1.0, 5.0]),
        run_rows("m", "stale", "pg", 0, dev=[1.0, 3.0, 1.0, 1.0]),
    ])
    s = A.leave_floor_step(steps).set_index("correction")["leave_floor_step"]
    assert s["is"] == 3 and math.isnan(s["pg"])


def test_ess_crossing_sees_the_batch_before_a_resync():
    steps = run_rows("m", "stale", "dlc", 0, ess_lag=[0.9, 1.0, 0.45], ess_lag_presync=[NAN, 0.4, NAN],
                     ess_lag_gauss=[0.8, 0.6, 0.3])
    c = A.ess_crossings(steps).iloc[0]
    assert c["ess_crossing_step"] == 2 and c["ess_gauss_crossing_step"] == 3


def test_accuracy_drop_and_collapse_against_bf16_pg_of_same_seed_and_step():
    acc = [NAN, 0.4, NAN, 0.4]
    steps = pd.concat([
        run_rows("m", "bf16", "pg", 0, test_accuracy=acc),
        run_rows("m", "bf16", "pg", 1, test_accuracy=[NAN, 0.1, NAN, 0.1]),
        run_rows("m", "stale", "center", 0, test_accuracy=[NAN, 0.3, NAN, 0.2], off_support=[0, 0.1, 0, 0.8]),
        run_rows("m", "stale", "center", 1, test_accuracy=[NAN, 0.1, NAN, 0.0]),
    ])
    d = A.accuracy_drops(steps).sort_values(["seed", "step"]).reset_index(drop=True)
    assert d["drop"].round(6).tolist() == [0.1, 0.2, 0.0, 0.1]
    assert d["collapse"].tolist() == [False, True, False, True]  # drop >= half the reference
    assert (d["correction"] != "pg").all()


def test_cumulative_multiple():
    steps = run_rows("m", "stale", "is", 0, dev=[1.0, 3.0, 2.0], floor=[0.0, 1.0, 1.0])
    c = A.cumulative_multiple(steps)["multiple_to_step"].tolist()
    assert math.isnan(c[0]) and c[1] == 3.0 and c[2] == 2.5  # step 1's floor is 0: its dev is not counted


def test_spearman_bootstrap_resamples_runs_and_is_one_for_monotone_pairs():
    rows = []
    for seed in range(4):
        for step, x in enumerate([0.1, 0.2, 0.3], start=1):
            rows.append(dict(model="m", sampler="stale", correction="pg", seed=seed, step=step, x=x + seed, y=2 * (x + seed)))
    df = pd.DataFrame(rows)
    rho, lo, hi, _, resamples = A.bootstrap_spearman(df, "x", "y", n_boot=200)
    assert rho == 1.0 and lo == 1.0 and hi == 1.0 and resamples == 200


def test_spearman_is_nan_on_constant_input():
    assert math.isnan(A.spearman(np.ones(5), np.arange(5.0)))


def test_off_support_before_and_at_collapse_with_and_without_resync():
    ref = [NAN, 0.4, NAN, 0.4, NAN, 0.4]
    steps = pd.concat([
        run_rows("m", "bf16", "pg", 0, test_accuracy=ref),
        run_rows("m", "stale", "center", 0, test_accuracy=[NAN, 0.35, NAN, 0.1, NAN, 0.0],
                 off_support=[0, 0.05, 0, 0.9, 0, 0.95], kl_sampler=[0, 0.2, 0, 0.3, 0, 0.4]),
        run_rows("m", "stale", "dlc", 0, test_accuracy=[NAN, 0.4, NAN, 0.38, NAN, 0.39],
                 off_support=[0, 0.02, 0, 0.08, 0, 0.1], kl_sampler=[0, 0.1, 0, 0.5, 0, 0.2]),
    ])
    t = A.off_support_summary(A.accuracy_drops(steps)).set_index(["model", "resync"])
    no, yes = t.loc[("m", "without")], t.loc[("m", "with")]
    assert no["collapse_points"] == 2 and no["off_support_before_max"] == 0.05
    assert no["off_support_at_collapse_mean"] == pytest.approx(0.925)
    assert yes["collapse_points"] == 0 and yes["off_support_before_max"] == 0.1
    assert no["kl_sampler_at_collapse_mean"] == pytest.approx(0.35)
    assert (no["kl_sampler_healthy_min"], no["kl_sampler_healthy_max"]) == (0.1, 0.5)


def test_tables_are_written_in_three_formats_with_the_paper_beside(tmp_path):
    steps = pd.concat([
        run_rows("m", s, c, k, dev=list(np.arange(1.0, 5.0) * (1 + k)), test_accuracy=[NAN, 0.3, NAN, 0.2 + 0.05 * k],
                 off_support=[0, 0.1 * k, 0, 0.2])
        for s in ("bf16", "stale") for c in ("pg", "is", "dlc") for k in (0, 1)
    ])
    runs = steps.groupby(A.RUN).agg(final_test_accuracy=("test_accuracy", "last")).reset_index()
    runs["initial_test_accuracy"] = 0.25
    runs["resync_steps"] = json.dumps([])
    runs["computed_as"] = ""
    T.write_all(steps, runs, tmp_path, n_boot=50)
    for name in T.CAPTIONS:
        for ext in ("tex", "md", "csv"):
            assert (tmp_path / f"{name}.{ext}").stat().st_size > 0
    assert r"\toprule" in (tmp_path / "noise_floor.tex").read_text()
    nf = pd.read_csv(tmp_path / "noise_floor.csv")
    row = nf.loc[(nf.sampler == "stale") & (nf.correction == "is")].iloc[0]
    assert row["paper"] == "115x (F10)"
    assert row["mean"] == pytest.approx(np.mean([2.5, 5.0]))  # dev = (1..4)·(1+k), floor 1 each: M = 2.5, 5
    findings = pd.read_csv(tmp_path / "findings.csv")
    assert findings["finding"].tolist() == ["R", "M"] + [f"F{i}" for i in range(1, 14)]
    # bf16/pg rises 0.25 -> 0.2 (seed 0) and 0.25 (seed 1): -5 and 0 points, below +10, but two seeds at
    # the sequential design's level (t with 1 degree of freedom) cannot tell
    r = findings.loc[findings["finding"] == "R"].iloc[0]
    assert r["value"] == pytest.approx(-2.5) and r["high"] > 10 and r["verdict"] == "undecided"
    acc = pd.read_csv(tmp_path / "accuracy.csv")
    assert acc.loc[(acc.sampler == "bf16") & (acc.correction == "pg"), "final per seed"].iloc[0] == "0.2/0.25"


def test_multiple_interval_is_a_point_when_every_run_has_the_same_multiple():
    steps = pd.concat([run_rows("m", "stale", "is", k, dev=[2.0, 4.0, 6.0], floor=[1.0, 2.0, 3.0]) for k in (0, 1, 2)])
    b = A.multiple_interval(steps).iloc[0]
    assert (b["mean"], b["ci_low"], b["ci_high"]) == pytest.approx((2.0, 2.0, 2.0))
    assert b["n_runs"] == 3 and b["probe_steps"] == 9


def test_multiple_interval_is_the_t_interval_of_the_runs_multiples_wider_than_their_min_max():
    steps = pd.concat([run_rows("m", "stale", "is", k, dev=[m] * 4, floor=[1.0] * 4) for k, m in enumerate((1.0, 2.0, 9.0))])
    b = A.multiple_interval(steps).iloc[0]
    half = 4.302653 * np.std([1.0, 2.0, 9.0], ddof=1) / np.sqrt(3)  # t_{0.975, 2} · sd / √3
    assert (b["mean"], b["ci_low"], b["ci_high"]) == pytest.approx((4.0, 4.0 - half, 4.0 + half))
    assert b["ci_low"] < 1.0 and b["ci_high"] > 9.0  # 3 seeds: wider than their range, where a bootstrap gave the range


def test_a_cell_counts_every_run_with_a_multiple_among_all_its_runs():
    """A run without a probe step (every floor 0, or diverged before its first probe) has no M: it is
    counted among the cell's runs, not among those with a multiple, and not averaged."""
    steps = pd.concat([run_rows("m", "stale", "is", 0, dev=[2.0], floor=[1.0]),
                       run_rows("m", "stale", "is", 1, dev=[3.0], floor=[0.0])])
    runs = pd.DataFrame({"model": "m", "sampler": "stale", "correction": "is", "seed": [0, 1, 2], "final_test_accuracy": 0.0,
                         "resync_steps": "[]", "computed_as": ""})
    b = A.multiple_interval(steps, A.per_run(steps, runs)).iloc[0]
    assert (b["n_runs"], b["n_valid"], b["mean"]) == (3, 1, 2.0) and math.isnan(b["ci_low"])


def test_copied_cells_count_once():
    steps = pd.concat([run_rows("m", "stale", c, 0, dev=[1.0]) for c in ("pg", "ppo", "is")])
    runs = pd.DataFrame({"model": "m", "sampler": "stale", "correction": ["pg", "ppo", "is"], "seed": 0,
                         "computed_as": ["", "results/m/stale/pg/seed0", ""]})
    assert sorted(A.distinct_runs(steps, runs)["correction"]) == ["is", "pg"]


def test_thin_probes_keeps_every_kth_probe_step_and_nothing_else():
    steps = run_rows("m", "stale", "is", 0, dev=[1.0, NAN, 2.0, NAN, 3.0, NAN, 4.0], floor=[1.0, NAN, 1.0, NAN, 1.0, NAN, 1.0])
    thin = A.thin_probes(steps, 2)
    assert thin.loc[thin["floor"].notna(), "step"].tolist() == [3, 7]
    assert thin["ess_lag"].tolist() == steps["ess_lag"].tolist()


def test_spearman_difference_is_zero_for_the_same_measure_and_positive_for_a_better_one():
    rows = []
    for k in range(6):
        for t in range(4):
            drop = 0.1 * k + 0.02 * t
            rows.append(dict(model="m", sampler="stale", correction="is", seed=k, step=t, drop=drop, good=drop,
                             bad=(k * 7 + t * 3) % 5))
    df = pd.DataFrame(rows)
    assert A.spearman_difference(df, "good", "good", "drop", n_boot=50)[0] == 0.0
    d, lo, hi, *_ = A.spearman_difference(df, "good", "bad", "drop", n_boot=200)
    assert d > 0.5 and lo > 0


def test_a_bootstrap_against_a_margin_draws_until_its_ends_monte_carlo_error_is_a_tenth_of_their_distance():
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"model": "m", "sampler": "s", "correction": "c", "seed": np.repeat(np.arange(30), 2),
                       "step": np.tile([1, 2], 30), "x": rng.normal(0.3, 1.0, 60)})
    mean = lambda a: float(a[:, 0].mean())  # noqa: E731
    b = A.bootstrap_runs(df, ["x"], mean, n_boot=200, margins=[0.0])
    distance = min(abs(b.low), abs(b.high))
    assert b.resamples > 200 and (b.mc_error < distance / 10 or b.resamples >= A.MOST_RESAMPLES)
    assert A.bootstrap_runs(df, ["x"], mean, n_boot=200).resamples == 200  # no margin: nothing to settle


def test_percentile_mc_error_shrinks_as_one_over_root_resamples():
    rng = np.random.default_rng(0)
    small, large = (A.percentile_mc_error(rng.normal(size=n), 0.025) for n in (1_000, 16_000))
    assert 2.5 < small / large < 6.5  # √16 = 4


def test_findings_from_one_group_of_seeds_pool_the_seeds_that_ran_and_say_which_group_did_not(tmp_path):
    """The main command alone (seeds 0-2 of a config whose groups are 0-2 and 3-5): the verdicts pool
    the seeds that ran (`seeds`); the other group's column stays, saying "not run", and the caption
    says so."""
    steps, runs = _study([("bf16", "pg"), ("stale", "is"), ("stale", "dlc")], seeds=(0, 1))
    T.write_all(steps, runs, tmp_path, n_boot=20, replicates=[[0, 1], [2, 3]])
    f = pd.read_csv(tmp_path / "findings.csv")
    assert list(f.columns[5:9]) == ["result", "seeds", "verdict", "seeds to decide"]
    assert (f["seeds 2,3"] == "not run").all() and (f["seeds 0,1"] != "not run").all()
    assert not f["verdict"].str.contains("not run").any()
    assert f.loc[f["finding"] == "R", "seeds"].iloc[0] == 2
    md = (tmp_path / "findings.md").read_text().splitlines()
    assert md[0].endswith("Not run in this grid: seeds 2,3; the verdicts pool the seeds that ran.")
    # both groups ran: the caption is as committed in paper_tables/findings.md
    T.write_all(steps, runs, tmp_path, n_boot=20, replicates=[[0], [1]])
    written = T.read_findings_table(tmp_path / "findings.csv")
    assert (tmp_path / "findings.md").read_text().splitlines()[0] == T.caption("findings", written)
    assert not pd.read_csv(tmp_path / "findings.csv")["seeds 0"].str.contains("not run").any()


def _study(cells, seeds=(0, 1)):
    """A hand-made steps and runs table over `cells` [(sampler, correction)]: 4 steps, probes at every step."""
    steps = pd.concat([
        run_rows("m", s, c, k, dev=[1.0, 2.0, 3.0, 4.0], test_accuracy=[NAN, 0.3, NAN, 0.4 - 0.1 * (s != "bf16")],
                 off_support=[0.0, 0.1, 0.0, 0.2], pass_at_1=[0.3] * 4, pass_at_k=[0.6] * 4, mixed_groups=[0.5] * 4,
                 grad_snr=[2.0] * 4, reward_mean=[-0.4] * 4, accuracy_greedy=[NAN, 0.3, NAN, 0.4],
                 accuracy_sampled=[NAN, 0.3, NAN, 0.4], heldout_accuracy_greedy=[NAN, 0.2, NAN, 0.2],
                 discrepancy_mean_abs=[0.01] * 4, lag_mean_abs=[0.0, 0.1, 0.2, 0.3])
        for s, c in cells for k in seeds
    ])
    runs = steps.groupby(A.RUN).agg(final_test_accuracy=("test_accuracy", "last")).reset_index()
    runs["initial_test_accuracy"] = 0.25
    runs["resync_steps"] = json.dumps([])
    runs["computed_as"] = ""
    return steps, runs


@pytest.mark.parametrize("cells", [
    [("stale", "dlc")],  # a single cell
    [("stale", "is"), ("stale", "dlc")],  # no on-policy reference
    [("bf16", "pg"), ("fp8", "pg")],  # no lagged sampler
], ids=["one-cell", "no-reference", "no-lagged-sampler"])
def test_every_table_and_figure_comes_out_of_a_sub_grid(tmp_path, cells):
    from dlcrepro.report import figures as F
    from dlcrepro.report import outputs

    steps, runs = _study(cells, seeds=(0,))
    t = T.write_all(steps, runs, tmp_path / "tables", n_boot=50, replicates=[[0], [1]])
    F.write_all(steps, tmp_path / "figures", runs)
    for name in T.CAPTIONS:
        assert (tmp_path / "tables" / f"{name}.md").stat().st_size > 0
    for o in outputs.FIGURES:
        if o.reads == "runs":  # the findings summary is drawn from the findings table, not given here
            assert (tmp_path / "figures" / f"{o.name}.png").stat().st_size > 0
    f = t["findings"].set_index("finding")
    if ("bf16", "pg") not in cells:  # accuracy drops need the reference: said, not a KeyError
        assert f.loc["R", "seeds 0"] == "not in this grid" or f.loc["R", "seeds 0"].endswith("not in this grid")
    assert (f["seeds 1"] == "not run").all()


def test_the_zoo_ranks_only_whole_multiples_and_equal_means_share_a_rank():
    """A collapsed run's M leaves out its steps with floor 0: that cell is not ranked beside full runs
    and says how many probe steps its M has; a copy and its source (the same runs) share a rank."""
    def cell(correction, dev, floor=(1.0, 1.0, 1.0, 1.0)):
        return [run_rows("m", "stale", correction, k, dev=[d * (1 + 0.1 * k) for d in dev], floor=list(floor),
                         test_accuracy=[NAN, NAN, NAN, 0.3]) for k in (0, 1, 2)]

    steps = pd.concat(cell("is", [1.0] * 4) + cell("is_resync", [1.0] * 4) + cell("center", [3.0] * 4)
                      + cell("pg", [0.5] * 4, floor=(1.0, 1.0, 0.0, 0.0)))  # pg collapsed after step 2: the lowest M, truncated
    runs = steps.groupby(A.RUN).agg(final_test_accuracy=("test_accuracy", "last")).reset_index()
    runs = runs.assign(initial_test_accuracy=0.25, resync_steps="[]", computed_as="", diverged_at_step=NAN)
    z = T.zoo_table(steps, A.per_run(steps, runs)).set_index("correction")
    assert z.loc["is", "rank by M"] == z.loc["is_resync", "rank by M"] == "1" and z.loc["center", "rank by M"] == "3"
    assert z.loc["pg", "rank by M"] == "—" and z.loc["pg", "probe steps in M"] == "6 of 12"
    assert list(z.index)[-1] == "pg"
    assert z.loc["is", "M (mean [95 % CI])"] == z.loc["is_resync", "M (mean [95 % CI])"]
