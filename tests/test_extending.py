"""Extending the harness as docs/extending.md says: a correction is one function and one registry entry,
nothing else; a figure is one registered function and one entry in the list of outputs; a metric one
registered function. A copy of this checkout gets a throw-away correction added exactly that way, and
the workflow trains it and puts it in the tables and figures beside `pg`; another copy gets a
throw-away figure, and the workflow draws it and the report shows it with its caption; a third gets
two throw-away metrics, and a cell's rows and the scan's rows carry them."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
from pandas.testing import assert_series_equal

from conftest import ROOT

THROWAWAY_FUNCTION = '''

@register_correction("halved_pg")
def halved_pg(t: TokenTerms, p: CorrectionParams) -> CorrectionLoss:
    """Half of pg's step on every token: a throw-away correction (tests/test_extending.py)."""
    return weighted_pg(t, token_logp(t), torch.full_like(t.adv, 0.5))
'''
THROWAWAY_ENTRY = '''
CORRECTION_INFO["halved_pg"] = CorrectionInfo("halved_pg", "½·A·∇ℓ(y)")
'''


THROWAWAY_FIGURE = '''

@draws("steps_logged")
def steps_logged(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> Figure:
    """The steps each cell logged: a throw-away figure (tests/test_extending.py)."""
    counts = steps.groupby(A.CELL).size()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.bar(range(len(counts)), counts.to_numpy())
    ax.set_xlabel("cell")
    ax.set_ylabel("steps logged")
    return fig
'''
THROWAWAY_FIGURE_ENTRY = '''
FIGURES += (figure("steps_logged", "The steps each cell logged: a throw-away figure."),)
'''


def copy_checkout(dst):
    """The files git knows of (tracked, and new ones it does not ignore), as a fresh clone has them."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def study_config(out, warm_start) -> list[str]:
    """--config values for a study of a checkout's copy: outputs under `out`, the test run's warm start."""
    return [f"results_dir={out / 'results'}", f"tables_dir={out / 'tables'}", f"figures_dir={out / 'figures'}",
            f"artifacts={warm_start.artifacts}", f"python={sys.executable}", "fork_server=False"]


@pytest.mark.slow
def test_a_correction_added_as_one_function_and_one_registry_entry_reaches_the_tables(tmp_path, smoke_warm_start):
    repo = tmp_path / "checkout"
    copy_checkout(repo)
    with open(repo / "dlcrepro" / "step" / "corrections.py", "a") as f:
        f.write(THROWAWAY_FUNCTION)
    with open(repo / "dlcrepro" / "core" / "registry.py", "a") as f:
        f.write(THROWAWAY_ENTRY)

    out = tmp_path / "out"
    # the test run's warm start, up to date: a new correction changes no warm start
    smoke_warm_start.up_to_date_in(out / "results")
    config = study_config(out, smoke_warm_start)
    grid = textwrap.dedent("""\
        grid:
          models: [tiny]
          samplers: [stale]
          corrections: [pg, halved_pg]
          seeds: [0]
        """)
    (repo / "configs" / "halved.yaml").write_text(grid)
    # the copy's package, not the installed one, in snakemake and in every job it starts
    env = {**os.environ, "PYTHONPATH": str(repo)}
    p = subprocess.run([sys.executable, "-m", "snakemake", "--nolock", "--cores", "2", "--configfile", "configs/smoke.yaml",
                        "configs/halved.yaml", *smoke_warm_start.SNAKEMAKE_ARGS, "--config", *config], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs.get("train") == "2" and "warmstart" not in jobs, (p.stdout + p.stderr)[-3000:]

    for table in ("noise_floor", "accuracy", "zoo"):
        t = pd.read_csv(out / "tables" / f"{table}.csv")
        assert ("stale", "halved_pg") in set(zip(t["sampler"], t["correction"])), table
    metrics = pd.read_parquet(out / "results" / "tiny" / "stale" / "halved_pg" / "seed0" / "metrics.parquet")
    assert (metrics["corr_weight_mean"] == 0.5).all() and (metrics["corr_masked_share"] == 0).all()
    summary = json.loads((out / "results" / "tiny" / "stale" / "halved_pg" / "seed0" / "summary.json").read_text())
    assert summary["correction"] == "halved_pg"
    assert (out / "figures" / "noise_floor.png").stat().st_size > 0


@pytest.mark.slow
def test_a_figure_added_as_one_function_and_one_entry_in_the_outputs_is_drawn_and_reported(tmp_path, smoke_warm_start):
    repo = tmp_path / "checkout"
    copy_checkout(repo)
    with open(repo / "dlcrepro" / "report" / "figures.py", "a") as f:
        f.write(THROWAWAY_FIGURE)
    with open(repo / "dlcrepro" / "report" / "outputs.py", "a") as f:
        f.write(THROWAWAY_FIGURE_ENTRY)

    out = tmp_path / "out"
    smoke_warm_start.up_to_date_in(out / "results")
    config = study_config(out, smoke_warm_start)
    (repo / "configs" / "one.yaml").write_text("grid:\n  models: [tiny]\n  samplers: [bf16]\n  corrections: [pg]\n  seeds: [0]\n")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    args = ["--nolock", "--configfile", "configs/smoke.yaml", "configs/one.yaml", *smoke_warm_start.SNAKEMAKE_ARGS, "--config",
            *config]
    p = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *args], cwd=repo, env=env, capture_output=True,
                       text=True,
                       timeout=1200)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert (out / "figures" / "steps_logged.png").stat().st_size > 0 and (out / "figures" / "steps_logged.pdf").stat().st_size > 0

    p = subprocess.run([sys.executable, "-m", "snakemake", "--report", str(out / "report.html"), *args], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    report = (out / "report.html").read_text()
    assert "steps_logged.png" in report and "The steps each cell logged: a throw-away figure." in report
    assert "ess.png" in report  # beside the study's own
    assert "reproduce.png" in report  # and the run against the committed study, which the run's last lines point to


THROWAWAY_METRICS = '''

@step_metric("batch", "reward_positive_share")
def _reward_positive_share(t: BatchTerms, row: dict) -> dict[str, float]:
    """Share of the batch's responses with a positive reward: a throw-away metric (tests/test_extending.py)."""
    return {"reward_positive_share": float((t.rewards > 0).double().mean())}


@step_metric("probe", "probe_floor_over_signal")
def _probe_floor_over_signal(t: ProbeTerms, row: dict) -> dict[str, float]:
    """floor / grad_signal, from the row so far: a throw-away probe-step metric (tests/test_extending.py)."""
    return {"probe_floor_over_signal": row["floor"] / row["grad_signal"] if row["grad_signal"] else math.nan}
'''


def test_a_metric_added_as_one_function_reaches_the_step_rows_and_the_scan(tmp_path, tiny_model_dir):
    """Adding a metric as docs/extending.md says: one function under `@step_metric` in
    diagnostics.py, nothing else. A copy of this checkout gets a batch metric and a probe-step
    metric added that way; a training cell writes both columns (the probe one NaN exactly off the
    probe steps, which is no fault) and the batch-size scan's rows carry them too."""
    repo = tmp_path / "checkout"
    copy_checkout(repo)
    with open(repo / "dlcrepro" / "step" / "diagnostics.py", "a") as f:
        f.write(THROWAWAY_METRICS)
    env = {**os.environ, "PYTHONPATH": str(repo)}  # the copy's package, not the installed one
    env.pop("DLCREPRO_SERVER", None)  # its own process: a fork server has the installed package imported
    out = tmp_path / "cell"
    train = [sys.executable, "-m", "dlcrepro", "train", "--config", "configs/smoke.yaml", "--model-dir", str(tiny_model_dir),
             "--sampler", "stale", "--correction", "dlc", "--seed", "0", "--out", str(out), "--set", "train.steps=4",
             "--set", "train.probe_every=2", "--set", "train.eval_every=2"]
    p = subprocess.run(train, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    m = pd.read_parquet(out / "metrics.parquet")
    assert (m["reward_positive_share"] == m["pass_at_1"]).all()  # reward +1 correct, −1 otherwise
    probing = m["floor"].notna()
    assert list(m.loc[probing, "step"]) == [2, 4]
    assert m.loc[~probing, "probe_floor_over_signal"].isna().all()
    # NaN where both sides are 0/0 (a probe with no signal: every advantage 0 on some CPUs' numbers)
    assert_series_equal(m.loc[probing, "probe_floor_over_signal"], m.loc[probing, "floor"] / m.loc[probing, "grad_signal"],
                        check_names=False, check_exact=True)

    scan = [sys.executable, "-m", "dlcrepro", "scan", "--config", "configs/smoke.yaml", "--model-dir", str(tiny_model_dir),
            "--sampler", "bf16", "--corrections", "pg", "--prompts", "2", "--reps", "1", "--n-boot", "50", "--out",
            str(tmp_path / "scan")]
    p = subprocess.run(scan, cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    raw = pd.read_parquet(tmp_path / "scan" / "scan.parquet")
    assert (raw["reward_positive_share"] == raw["pass_at_1"]).all()
    assert_series_equal(raw["probe_floor_over_signal"], raw["floor"] / raw["grad_signal"], check_names=False, check_exact=True)
