"""The sequential design (`snakemake decide`, dlcrepro/study/decide.py): which cells the next look trains
given a findings table, where it stops, the workflow's checkpoint, and the plan's price of it."""

import json
import math
import re
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from conftest import ROOT, SMOKE
from dlcrepro.study import decide as D
from dlcrepro.report import findings as F
from dlcrepro.cluster import load_merged
from dlcrepro.core.config import ConfigError
from dlcrepro.core.grid import SAMPLERS
from dlcrepro.core.registry import CORRECTION_INFO

GRID = [f"tiny/{s}/{c}" for s in ("bf16", "fp8", "stale") for c in ("pg", "center", "is", "is_center", "dlc")]


def design(first=6, batch=3, cap=24, copies=None, minutes=None, cap_gpu_hours=0.0) -> dict:
    """A design file as decide.design_file writes it, by hand: a grid of three samplers and five corrections."""
    d = D.Design(first, batch, cap)
    cost = {c: minutes for c in GRID}
    return {"design": {"first": first, "batch": batch, "cap": cap}, "looks": d.looks, "level": d.level,
            "seed_order": list(range(cap)), "grid": GRID, "copies": copies or {}, "train_gpu_minutes": cost,
            "rollouts_gpu_minutes": {"tiny/stale": 0.0 if minutes is not None else None},
            "initial_eval_gpu_minutes": {"tiny": 0.0 if minutes is not None else None}, "cap_gpu_hours": cap_gpu_hours}


def table(*rows) -> pd.DataFrame:
    """A pooled findings table: (finding, verdict, seeds, seeds needed, decidable) per row."""
    return pd.DataFrame([{"finding": f, "model": "tiny", "verdict": v, "seeds": n, "seeds needed": need, "decidable": dec}
                         for f, v, n, need, dec in rows])


def grid_cells(seeds) -> list[str]:
    return [f"{c}/seed{k}" for c in GRID for k in seeds]


def status(look: dict) -> dict[str, str]:
    return {f["finding"]: f["status"] for f in look["findings"]}


def test_the_design_has_looks_every_batch_up_to_the_cap_and_a_bonferroni_level():
    d = D.Design(6, 3, 24)
    assert d.looks == (6, 9, 12, 15, 18, 21, 24)
    assert d.level == pytest.approx(1 - 0.05 / 7)
    assert D.Design(6, 4, 12).looks == (6, 10, 12)  # the last batch cut to the cap


def test_too_many_looks_are_refused_naming_the_keys():
    cfg = load_merged([str(SMOKE)], {"decide.batch": 1, "decide.cap_seeds": 20})
    with pytest.raises(ConfigError, match=r"decide\.cap_seeds=20 with decide\.batch=1 .* 20 looks"):
        D.design_of(cfg)


def test_a_negative_gpu_hour_cap_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"decide\.cap_gpu_hours=-1"):
        load_merged([str(SMOKE)], {"decide.cap_gpu_hours": -1})


def test_every_finding_names_the_cells_its_rule_reads_and_drops_read_the_reference():
    assert list(D.CELLS_READ) == [f.id for f in F.FINDINGS]
    for f, cells in D.CELLS_READ.items():
        for s, c in cells or ():
            assert s in SAMPLERS and c in CORRECTION_INFO, (f, s, c)
    for f in ("R", "F1", "F4", "F7"):  # rules that read accuracy drops, each against the reference of its seed
        assert D.REFERENCE in D.CELLS_READ[f], f
    assert [f for f, cells in D.CELLS_READ.items() if cells is None] == ["F11", "F12", "F13"]


def test_the_next_look_trains_the_cells_of_the_undecided_findings_only():
    t = table(("F3", "undecided", 6, 8.0, True), ("F5", "seen", 6, math.nan, True), ("F6", "contradicted", 6, math.nan, True),
              ("F11", "seen", 6, math.nan, False))
    look = D.next_look(t, design(), 0, grid_cells(range(6)))
    assert status(look) == {"F3": "open", "F5": "decided", "F6": "decided", "F11": D.EVERY_CELL}
    assert look["open"] == ["F3 (tiny)"] and not look["done"]
    # F3 reads fp8/pg and fp8/center: seeds 6, 7, 8 of those two cells, nothing else
    assert look["next"]["cells"] == [f"tiny/fp8/{c}/seed{k}" for c in ("center", "pg") for k in (6, 7, 8)]
    assert look["next"]["seeds"] == 9 and "F3 (tiny)" in look["next"]["why"]


def test_a_finding_whose_projection_lies_past_the_cap_stops_early_and_says_so():
    t = table(("F8", "undecided", 6, 40.0, True), ("F10", "undecided", 6, 12.0, True))
    look = D.next_look(t, design(), 0, grid_cells(range(6)))
    f8 = next(f for f in look["findings"] if f["finding"] == "F8")
    assert f8["status"] == "stopped early: past the cap" and "needs 40 seeds" in f8["why"] and "decide.cap_seeds=24" in f8["why"]
    assert look["stopped_past_cap"] == ["F8 (tiny)"]
    # F10 reads stale/is_resync, which this grid lacks, and stale/is: only stale/is trains
    assert {c.rsplit("/", 1)[0] for c in look["next"]["cells"]} == {"tiny/stale/is"}


def test_a_rule_more_seeds_cannot_decide_spends_none():
    t = table(("F1", "undecided", 6, math.nan, False))
    look = D.next_look(t, design(), 0, grid_cells(range(6)))
    assert status(look) == {"F1": "stopped: seeds cannot decide it"} and look["done"] and look["next"]["cells"] == []


def test_one_seed_measures_no_spread_so_its_findings_stay_open():
    t = table(("F5", "undecided", 1, math.nan, True))
    look = D.next_look(t, design(first=1, batch=1, cap=3), 0, grid_cells([0]))
    assert status(look) == {"F5": "open"} and look["next"]["cells"] == ["tiny/stale/center/seed1"]


def test_the_looks_stop_at_the_cap():
    d = design(first=6, batch=3, cap=9)
    t = table(("F5", "undecided", 9, 9.0, True))
    done = grid_cells(range(6)) + [f"tiny/stale/center/seed{k}" for k in (6, 7, 8)]
    look = D.next_look(t, d, 1, done)
    assert status(look) == {"F5": "stopped at the cap"} and look["done"] and look["next"]["cells"] == []
    assert "every finding is decided or stopped" in look["next"]["why"]


def test_a_finding_stopped_at_an_earlier_look_keeps_its_verdict_there():
    first = D.next_look(table(("F5", "seen", 6, math.nan, True), ("F3", "undecided", 6, 8.0, True)), design(), 0,
                        grid_cells(range(6)))
    later = D.next_look(table(("F5", "undecided", 9, 30.0, True), ("F3", "seen", 9, math.nan, True)), design(), 1,
                        first["cells"] + first["next"]["cells"], first)
    f5 = next(f for f in later["findings"] if f["finding"] == "F5")
    assert (f5["status"], f5["verdict"], f5["look"], f5["now"]) == ("decided", "seen", 0, "undecided")
    assert later["done"]


def test_a_cell_that_copies_another_brings_its_twin():
    d = design(copies={"tiny/fp8/dlc": "tiny/fp8/is_center"})
    D.CELLS_READ["_test"] = (("fp8", "dlc"),)
    try:
        look = D.next_look(table(("_test", "undecided", 6, 8.0, True)), d, 0, grid_cells(range(6)))
    finally:
        del D.CELLS_READ["_test"]
    assert look["next"]["cells"] == [f"tiny/fp8/{c}/seed{k}" for c in ("dlc", "is_center") for k in (6, 7, 8)]


def test_the_gpu_hour_cap_stops_the_looks_before_a_batch_that_would_pass_it():
    t = table(("F3", "undecided", 6, 8.0, True))
    within = D.next_look(t, design(minutes=60.0, cap_gpu_hours=6.0), 0, grid_cells(range(6)))
    assert within["next"]["gpu_minutes"] == 6 * 60.0 and not within["done"]  # 6 cells of an hour each
    over = D.next_look(t, design(minutes=60.0, cap_gpu_hours=5.0), 0, grid_cells(range(6)))
    assert over["done"] and status(over) == {"F3": "stopped at the GPU-hour cap"}
    assert "past decide.cap_gpu_hours=5" in over["next"]["why"]


def test_the_adapter_reads_todays_findings_table_pooled_over_every_seed():
    """pooled_verdicts on the findings table of the committed study's findings input."""
    from dlcrepro.report.tables import read_findings_input

    steps, runs = read_findings_input(ROOT / "paper_tables")
    seeds = ",".join(str(k) for k in sorted(runs["seed"].unique()))
    table_ = F.findings_from_input(steps, runs.assign(replicates=seeds), n_boot=200)
    pooled = D.pooled_verdicts(table_)
    assert list(pooled["finding"]) == [f.id for f in F.FINDINGS]
    assert set(pooled["verdict"]) <= {"seen", "contradicted", "undecided", "cannot tell"}
    # each finding pools the seeds its cells ran: six for every cell, more where the decide run added them
    assert (pooled["seeds"] >= 6).all() and (pooled["seeds"] <= runs["seed"].nunique()).all()
    for r, result in zip(pooled.to_dict("records"), table_["result"]):
        assert F.MARK[r["verdict"]] == result[:1]
    assert D.pooled_verdicts(pooled).equals(pooled)  # a pooled table passes as it is
    with pytest.raises(ValueError, match="before the pooled verdict"):
        D.pooled_verdicts(table_.drop(columns=["verdict"]))


def test_the_plan_prices_each_look_of_the_paper_at_the_cap_and_as_expected():
    cfg = load_merged([str(ROOT / "configs" / "paper.yaml")])
    lines = D.plan_lines(cfg, {"F3": ("undecided", 8.0), "F5": ("seen", math.nan), "F8": ("undecided", 40.0)}, "a test")
    text = "\n".join(lines)
    assert "looks at 3, 6, 9, 12, 15, 18, 21 seeds" in text, text
    rows = [re.match(r"\s+(\d+)\s+(\d+)\s+(\d+) cells\s+([\d.]+)\s+(\d+) cells\s+([\d.]+)", x) for x in lines]
    rows = [r.groups() for r in rows if r]
    assert [int(r[1]) for r in rows] == [6, 9, 12, 15, 18, 21]
    # at the cap: every cell a spendable finding reads (dlcrepro/study/decide.py CELLS_READ) that the paper's grid
    # has x 2 models x 3 seeds a look
    from dlcrepro import cluster

    grid = {(c.sampler, c.correction) for c in cluster.grid_cells(cfg)}
    read = {cell for cells in D.CELLS_READ.values() for cell in cells or () if cell in grid}
    assert all(int(r[2]) == len(read) * 2 * 3 for r in rows), (len(read), rows)
    # expected: F3 alone stays open, until the look at 9 seeds: fp8/pg and fp8/center, 2 models, 3 seeds a look
    assert [int(r[4]) for r in rows] == [12, 12, 0, 0, 0, 0]
    assert float(rows[0][5]) < float(rows[0][3]) and float(rows[2][5]) == 0.0
    assert "open findings stop at: F3 at 9" in text


@pytest.mark.snakemake
def test_plan_on_the_paper_config_prints_the_decide_section():
    p = subprocess.run([sys.executable, "-m", "dlcrepro", "plan", "--config", "configs/paper.yaml"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert "decide (target `decide`" in p.stdout and "expected" in p.stdout and "at the cap" in p.stdout, p.stdout[-3000:]


def smoke_decide_config(tmp_path, batch=1, cap=3) -> list[str]:
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["decide"] = {"batch": batch, "cap_seeds": cap}
    cfg.update(results_dir=str(tmp_path / "results"), artifacts=str(tmp_path / "artifacts"),
               figures_dir=str(tmp_path / "figures"), tables_dir=str(tmp_path / "tables"))
    path = tmp_path / "smoke-decide.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return ["--configfile", str(path)]


def snakemake(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "snakemake", "--nolock", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.snakemake
def test_the_dry_run_of_decide_shows_the_first_looks_checkpoint(tmp_path):
    p = snakemake("-n", *smoke_decide_config(tmp_path), "--quiet", "rules", "--", "decide")
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", said, re.M))
    assert jobs["train"] == "28" and jobs["decide_look"] == "1" and jobs["decide"] == "1", jobs
    assert "checkpoint jobs" in said


@pytest.mark.snakemake
def test_a_cell_of_a_seed_past_the_grid_is_the_grids_cell_with_that_seed(tmp_path):
    """The smoke grid has seed 0 only; its decide run trains seeds 1 and 2. Such a cell that copies
    another (bf16/dlc is bf16/is_center) waits for its twin, and a lagged cell reads its seed's shared
    rollouts, kept with the top-k the grid's corrections read; a seed past the cap is no cell."""
    cfg = smoke_decide_config(tmp_path)
    results = tmp_path / "results" / "tiny"
    p = snakemake("-n", "-p", *cfg, "--", str(results / "bf16" / "dlc" / "seed2" / "summary.json"),
                  str(results / "stale" / "center" / "seed2" / "summary.json"))
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    trained = sorted(re.findall(r"--correction (\w+) --seed (\d+)", said))
    assert trained == [("center", "2"), ("dlc", "2"), ("is_center", "2")], trained
    assert re.search(r"dlcrepro rollouts .*--sampler stale --seed 2 --topk 64 ", said), said[-3000:]
    p = snakemake("-n", *cfg, "--", str(results / "bf16" / "pg" / "seed3" / "summary.json"))
    assert p.returncode != 0 and "No rule to produce" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]


@pytest.mark.slow
def test_the_smoke_decide_run_trains_only_the_undecided_findings_cells_to_its_cap(tmp_path):
    """The smoke grid (one seed) decided with a batch of 1 seed up to 3: each look's JSON says what it
    read and what it asked for, the next look read exactly that, and the summary ends the run."""
    started = time.monotonic()
    p = snakemake("--cores", "2", *smoke_decide_config(tmp_path), "--", "decide", timeout=900)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    wall = time.monotonic() - started
    looks = sorted((tmp_path / "results" / "_decide").glob("look*.json"), key=lambda f: int(f.stem[4:]))
    records = [json.loads(f.read_text()) for f in looks]
    assert [r["look"] for r in records] == list(range(len(records))) and records[-1]["done"]
    assert not any(r["done"] for r in records[:-1])
    assert len(records[0]["cells"]) == 28  # the grid, seed 0
    for before, after in zip(records, records[1:]):
        assert sorted(after["cells"]) == sorted(set(before["cells"]) | set(before["next"]["cells"]))
        assert before["next"]["cells"], before
        # a new seed's cells are the cells of findings open at the look before (and the twins they copy)
        read = {f"tiny/{s}/{c}" for f in before["findings"] if f["status"] == "open" for s, c in D.CELLS_READ[f["finding"]]}
        assert {c.rsplit("/", 1)[0] for c in before["next"]["cells"]} <= read
    assert max(int(c.rsplit("seed", 1)[1]) for c in records[-1]["cells"]) <= 2  # the cap: 3 seeds
    for f in records[-1]["findings"]:
        assert f["status"] != "open"
        if f["finding"] in ("F11", "F12", "F13"):
            assert f["status"] == D.EVERY_CELL
    summary = (tmp_path / "results" / "_decide" / "decide.md").read_text()
    assert "| look | seeds |" in summary and "Ended:" in summary
    print(f"smoke decide run: {wall:.0f} s, {len(records)} looks, {len(records[-1]['cells'])} cells")
