"""The sequential design's decisions (`snakemake decide`, workflow/rules/decide.smk): after each look
(the seeds trained so far), which findings are decided, which stop, and which cells the next batch of
seeds trains, for the undecided findings only and for the cells their rules read (`CELLS_READ`).

A look reads the findings table through one adapter, `pooled_verdicts`: one pooled verdict per
finding and model over every seed run (`verdict`, `seeds`, `seeds needed`, `decidable`). Then, per
finding (`finding_status`): seen or contradicted is decided; a rule with nothing to read, or one
that reads every cell (F11, F12, F13: "not spent: reads every cell"), spends no seeds; an undecided
one whose rule more seeds cannot decide, or whose projection lies past the cap, stops now and says so;
the rest are open, and their cells train up to the next look's seed count (`Design.looks`). A finding
once stopped stays stopped at the look and verdict it stopped with. Optionally the looks stop where
the next batch would take the GPU-hours past `decide.cap_gpu_hours` (the plan's cost model,
`batch_gpu_minutes`).

Torch- and pandas-free at import, as grid.py: the Snakefile reads it while it lays out the DAG.
"""

from __future__ import annotations

import dataclasses
import math

from ..core.config import Config, ConfigError
from ..core.registry import CORRECTION_INFO, resync_corrections
from ..report.sequential import Design

MAX_LOOKS = 7  # Snakemake re-evaluates the DAG after each checkpoint: a handful of looks, not dozens

REFERENCE = ("bf16", "pg")  # on-policy training: every accuracy drop is measured against it, seed by seed
EVERY_CELL = "not spent: reads every cell"

# The cells (sampler, correction) each finding's rule in dlcrepro/report/findings.py reads, the fewest that
# decide it; a rule that reads accuracy drops (analysis.accuracy_drops) also reads the reference of
# the same seed. None: the rule pools every cell's collapse points, so no few cells can decide it.
CELLS_READ: dict[str, tuple[tuple[str, str], ...] | None] = {
    "R": (REFERENCE,),  # reference_learns: bf16/pg's rise per seed
    # mechanism's ratio per seed is a mean over every fp8 cell and every stale cell without resync: a new
    # seed trains them all, or its ratio would be another quantity than the first seeds' (cells outside
    # the grid are dropped)
    "M": (tuple(("fp8", c) for c in CORRECTION_INFO)
          + tuple(("stale", c) for c in CORRECTION_INFO if c not in resync_corrections())),
    "F1": (("stale", "is"), REFERENCE),  # the ESS crossing and a collapse (a drop against the reference)
    "F2": (("stale", "is"),),  # the empirical and the Gaussian crossing, no drop
    "F3": (("fp8", "pg"), ("fp8", "center")),
    "F4": (("fp8", "center"), REFERENCE),  # the paired accuracy difference to the reference
    "F5": (("stale", "center"),),
    "F6": (("stale", "is_center"), ("stale", "center")),
    # the rule reads stale/ppo_multi's M; its text the same correction's on-policy runs beside it, and
    # whether they collapsed (drops: the reference)
    "F7": (("stale", "ppo_multi"), ("bf16", "ppo_multi"), ("fp8", "ppo_multi"), REFERENCE),
    "F8": (("stale", "dlc"),),
    "F9": (("stale", "dlc"),),
    "F10": (("stale", "is_resync"), ("stale", "is")),
    "F11": None,
    "F12": None,
    "F13": None,
}


def design_of(cfg: Config) -> Design:
    """The config's design; ConfigError naming the keys where it has more than MAX_LOOKS looks."""
    d = Design(len(cfg.grid.seeds), cfg.decide.batch, max(cfg.decide.cap_seeds, len(cfg.grid.seeds)))
    if len(d.looks) > MAX_LOOKS:
        raise ConfigError(
            f"decide.cap_seeds={cfg.decide.cap_seeds} with decide.batch={cfg.decide.batch} from grid.seeds' {d.first} seeds "
            f"makes {len(d.looks)} looks ({', '.join(map(str, d.looks))} seeds); at most {MAX_LOOKS}: Snakemake re-evaluates "
            "the DAG after each look. Raise decide.batch or lower decide.cap_seeds")
    return d


def seed_order(cfg: Config) -> list[int]:
    """The seeds a decide run can train, in the order it adds them: grid.seeds, then the smallest
    seeds not among them, up to decide.cap_seeds in all."""
    seeds = list(dict.fromkeys(int(s) for s in cfg.grid.seeds))
    k = 0
    while len(seeds) < cfg.decide.cap_seeds:
        if k not in seeds:
            seeds.append(k)
        k += 1
    return seeds


def widened(cfg: Config) -> Config:
    """The config whose grid holds every seed a decide run can train: the cells such a seed would
    have in the grid (which of them copy another's run, the top-k its rollouts keep) are those."""
    return dataclasses.replace(cfg, grid=dataclasses.replace(cfg.grid, seeds=seed_order(cfg)))


def cell_name(model: str, sampler: str, correction: str, seed: int | None = None) -> str:
    name = f"{model}/{sampler}/{correction}"
    return name if seed is None else f"{name}/seed{seed}"


def parse_cell(name: str) -> tuple[str, str, str, int]:
    model, sampler, correction, seed = name.split("/")
    return model, sampler, correction, int(seed.removeprefix("seed"))


# ----------------------------------------------------------------------------- the design file


def design_file(cfg: Config) -> dict:
    """What every look reads besides the findings: the design, the order seeds are added in, the
    grid's cells (model/sampler/correction), which of them copy another's run, and the cost model's
    GPU-minutes of each job a batch can add (None where a model is not in it). Written by the
    workflow as <results_dir>/_decide/design.json."""
    from ..cluster import (copy_source, estimated_minutes, grid_cells, initial_eval_minutes, job_resources, rollouts_minutes)
    from ..core.grid import get_sampler

    d = design_of(cfg)
    wide = widened(cfg)
    cells = grid_cells(wide)
    keys = {(c.model, c.sampler, c.correction, c.seed) for c in cells}
    combos = list(dict.fromkeys((c.model, c.sampler, c.correction) for c in cells))
    cost, rollouts, initial = {}, {}, {}
    for m in dict.fromkeys(cfg.grid.models):
        gpu = job_resources(cfg, m)["gpu"]
        t = cfg.train_for(m)
        ie = initial_eval_minutes(cfg, m)
        initial[m] = None if ie is None else gpu * ie
        for s in dict.fromkeys(cfg.grid.samplers):
            if get_sampler(s).shared_steps(t.steps, t.sync_every) > 0:
                r = rollouts_minutes(cfg, m, s)
                rollouts[f"{m}/{s}"] = None if r is None else gpu * r
    for m, s, c in combos:
        e = estimated_minutes(cfg, m, c)
        cost[cell_name(m, s, c)] = None if e is None else gpu_of(cfg, m) * e
    copies = {}
    for m, s, c in combos:
        same = copy_source(cfg, m, s, c, seed_order(cfg)[0], keys)
        if same:
            copies[cell_name(m, s, c)] = cell_name(m, s, same)
    if cfg.decide.cap_gpu_hours > 0:
        priced = [n for n, v in cost.items() if v is None]
        if priced:
            raise ConfigError(f"decide.cap_gpu_hours={cfg.decide.cap_gpu_hours}: the cost model (dlcrepro/cluster/costs.py) "
                              f"prices no job of {sorted({n.split('/')[0] for n in priced})}; set it to 0 (no cap)")
    return {"design": dataclasses.asdict(d), "looks": d.looks, "level": d.level, "seed_order": seed_order(cfg),
            "grid": [cell_name(*c) for c in combos], "copies": copies, "train_gpu_minutes": cost,
            "rollouts_gpu_minutes": rollouts, "initial_eval_gpu_minutes": initial,
            "cap_gpu_hours": cfg.decide.cap_gpu_hours}


def gpu_of(cfg: Config, model: str) -> int:
    from ..cluster import job_resources

    return job_resources(cfg, model)["gpu"]


def with_twins(cells: list[str], copies: dict[str, str]) -> list[str]:
    """`cells` (model/sampler/correction/seed<k>) with the cell each copy copies: it trains first."""
    out = list(cells)
    for name in cells:
        m, s, c, k = parse_cell(name)
        twin = copies.get(cell_name(m, s, c))
        if twin:
            out.append(f"{twin}/seed{k}")
    return sorted(dict.fromkeys(out), key=_cell_order)


def _cell_order(name: str):
    m, s, c, k = parse_cell(name)
    return (m, s, c, k)


def batch_gpu_minutes(design: dict, done: list[str], new: list[str]) -> float | None:
    """GPU-minutes of training the cells `new` after `done` (model/sampler/correction/seed<k>) by
    the cost model: each trained cell's (a copy's none), and a rollouts job per lagged sampler and
    a θ_0 evaluation per model for each seed none of `done` has; None where a job is not priced."""
    total = 0.0
    have = {(parse_cell(n)[0], parse_cell(n)[3]) for n in done}
    have_rollouts = {(parse_cell(n)[0], parse_cell(n)[1], parse_cell(n)[3]) for n in done}
    for name in new:
        m, s, c, k = parse_cell(name)
        if cell_name(m, s, c) in design["copies"]:
            continue
        parts = [design["train_gpu_minutes"].get(cell_name(m, s, c))]
        if (m, k) not in have:
            parts.append(design["initial_eval_gpu_minutes"].get(m))
            have.add((m, k))
        rollouts_key = f"{m}/{s}"
        if rollouts_key in design["rollouts_gpu_minutes"] and (m, s, k) not in have_rollouts:
            parts.append(design["rollouts_gpu_minutes"][rollouts_key])
            have_rollouts.add((m, s, k))
        if any(p is None for p in parts):
            return None
        total += sum(parts)
    return total


# ----------------------------------------------------------------------------- the findings, pooled


def pooled_verdicts(table):
    """The findings table as a look reads it, one row per finding and model: `verdict` (seen,
    contradicted, undecided, cannot tell, over every seed run), `seeds` (seeds pooled), `seeds needed`
    (float: for an undecided rule, the seeds that would decide it with 80 % power at the observed
    spread; NaN where none would) and `decidable` (whether more seeds can decide the rule): the one
    place a look reads findings.findings_table."""
    want = ["finding", "model", "verdict", "seeds", "seeds needed", "decidable"]
    missing = sorted(set(want) - set(table.columns))
    if missing:
        raise ValueError(f"pooled_verdicts: a findings table without {missing}: written before the pooled verdict "
                         f"(rules {findings_rules()}); rebuild it with `python -m dlcrepro findings --from DIR`")
    return table[want].reset_index(drop=True)


def findings_rules() -> str:
    from ..report.findings import RULES_COMMIT

    return RULES_COMMIT


def findings_of_look(steps, runs, design: Design):
    """The findings table of a look's runs, pooled over every seed that ran, each interval at the
    design's level (Bonferroni over its planned looks)."""
    from ..report.findings import findings_table

    return findings_table(steps, runs, design=design)


def expected_from(directory) -> dict[str, tuple[str, float]]:
    """{finding: (verdict, seeds needed)} of a study's findings input in `directory` (the tables job's
    findings_steps.csv and findings_runs.csv), pooled over all its seeds as a look pools them; a
    finding of several models keeps its largest projection. What the plan's "expected" column
    assumes the decide run will see."""
    from ..report.findings import findings_from_input
    from ..report.tables import read_findings_input

    steps, runs = read_findings_input(directory)
    seeds = ",".join(str(k) for k in sorted(runs["seed"].unique()))
    pooled = pooled_verdicts(findings_from_input(steps, runs.assign(replicates=seeds), n_boot=200))
    out: dict[str, tuple[str, float]] = {}
    for r in pooled.to_dict("records"):
        need = float(r["seeds needed"]) if r["decidable"] else math.nan
        before = out.get(r["finding"])
        if before is None or before[0] != "undecided" or (need == need and need > before[1]):
            out[r["finding"]] = (r["verdict"], need)
    return out


# ----------------------------------------------------------------------------- one look


DECIDED, OPEN = "decided", "open"


def finding_status(verdict: str, seeds: int, needed: float, decidable: bool, cells: list | None, design: Design,
                   last: bool) -> tuple[str, str]:
    """(status, why) of one finding at a look: decided, open (its cells train the next batch), or
    a reason it spends no more seeds."""
    if cells is None:
        return EVERY_CELL, "its rule pools every cell's collapse points; no few cells decide it"
    if verdict in ("seen", "contradicted"):
        return DECIDED, f"{verdict} on {seeds} seed{'s' if seeds != 1 else ''}"
    if verdict != "undecided":
        return "not spent: nothing to read", f"{verdict}: its cells are not in this grid or show nothing to read"
    if not cells:
        return "not spent: nothing to read", "none of the cells its rule reads is in this grid"
    if not decidable:
        return "stopped: seeds cannot decide it", "more seeds cannot decide its rule"
    if math.isnan(needed) and seeds >= 2 and not last:
        return "stopped: seeds cannot decide it", "no number of seeds decides it at the observed mean and spread"
    if needed > design.cap:
        return "stopped early: past the cap", (f"needs {needed:.0f} seeds at the observed spread, past decide.cap_seeds="
                                               f"{design.cap}")
    if last or seeds >= design.cap:
        return "stopped at the cap", f"still undecided at the cap, decide.cap_seeds={design.cap}"
    if math.isnan(needed):
        return OPEN, f"undecided on {seeds} seed: no spread measured yet"
    return OPEN, f"undecided on {seeds} seeds, needs {needed:.0f} at the observed spread"


def next_look(pooled, design: dict, k: int, cells_so_far: list[str], previous: dict | None = None) -> dict:
    """Look k's record: each finding's verdict and status, the cells read (model/sampler/correction/
    seed<k>), and the next batch: the cells the open findings read, at the next look's seed count
    (`design["looks"][k + 1]`), those not trained yet, with the cells they copy. `pooled` is the
    look's `pooled_verdicts`; `previous` look k − 1's record (its stopped findings stay stopped)."""
    d = Design(**design["design"])
    looks, order = design["looks"], design["seed_order"]
    last = k >= len(looks) - 1
    grid = set(design["grid"])
    stopped_before = {(f["finding"], f["model"]): f for f in (previous or {}).get("findings", []) if f["status"] != OPEN}
    findings, wanted = [], {}
    for r in pooled.to_dict("records"):
        key = (r["finding"], r["model"])
        read = CELLS_READ.get(r["finding"], None)
        cells = None if read is None else [c for c in read if cell_name(r["model"], *c) in grid]
        status, why = finding_status(r["verdict"], int(r["seeds"]), float(r["seeds needed"]), bool(r["decidable"]), cells, d,
                                     last)
        row = {"finding": r["finding"], "model": r["model"], "verdict": r["verdict"], "seeds": int(r["seeds"]),
               "seeds needed": None if math.isnan(float(r["seeds needed"])) else float(r["seeds needed"]),
               "status": status, "why": why, "look": k}
        if key in stopped_before:  # stopped at an earlier look: its verdict there stands, today's beside it
            before = stopped_before[key]
            row.update({k2: before[k2] for k2 in ("status", "why", "look", "verdict", "seeds", "seeds needed")},
                       now=r["verdict"])
        elif status == OPEN:
            for s, c in cells:
                name = cell_name(r["model"], s, c)
                wanted[name] = max(wanted.get(name, 0), looks[k + 1])
        findings.append(row)
    done = set(cells_so_far)
    new = [f"{name}/seed{seed}" for name, n in wanted.items() for seed in order[:n] if f"{name}/seed{seed}" not in done]
    new = [c for c in with_twins(new, design["copies"]) if c not in done]
    spent = (previous or {}).get("gpu_minutes_after_first")
    spent = 0.0 if previous is None else spent
    minutes = batch_gpu_minutes(design, list(done), new)
    why_stop = ""
    cap_h = design.get("cap_gpu_hours") or 0
    if new and cap_h > 0 and minutes is not None and (spent + minutes) / 60 > cap_h:
        why_stop = (f"the next batch's {minutes / 60:.1f} GPU-h would bring the looks after the first to "
                    f"{(spent + minutes) / 60:.1f}, past decide.cap_gpu_hours={cap_h:g}")
        for f in findings:
            if f["status"] == OPEN:
                f.update(status="stopped at the GPU-hour cap", why=why_stop)
        new, minutes = [], 0.0
    return {
        "look": k, "looks": looks, "seeds": looks[k] if k < len(looks) else looks[-1],
        "cells": sorted(done, key=_cell_order),
        "seeds_per_cell": _seeds_per_cell(done),
        "findings": findings,
        "open": [f"{f['finding']} ({f['model']})" for f in findings if f["status"] == OPEN],
        "stopped_past_cap": [f"{f['finding']} ({f['model']})" for f in findings if f["status"] == "stopped early: past the cap"],
        "next": {"cells": new, "seeds": looks[k + 1] if new else None, "gpu_minutes": minutes if new else 0.0,
                 "why": (why_stop or ("for " + ", ".join(f"{f['finding']} ({f['model']})" for f in findings
                                                          if f["status"] == OPEN)) if new else
                         (why_stop or "every finding is decided or stopped"))},
        "gpu_minutes_after_first": None if spent is None or minutes is None else spent + (minutes if new else 0.0),
        "done": not new,
    }


def _seeds_per_cell(cells) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name in sorted(cells, key=_cell_order):
        m, s, c, k = parse_cell(name)
        out.setdefault(cell_name(m, s, c), []).append(k)
    return out


def first_look_cells(cfg: Config) -> list[str]:
    """Look 0 reads the grid as run: every cell of grid.seeds."""
    from ..cluster import grid_cells

    return [c.name for c in grid_cells(cfg)]


def look_cells(k: int, first: list[str], previous: dict | None) -> list[str]:
    """The cells look k reads: the grid's at look 0, else look k − 1's and the batch it trained."""
    if k == 0:
        return list(first)
    return sorted(set(previous["cells"]) | set(previous["next"]["cells"]), key=_cell_order)


# ----------------------------------------------------------------------------- the summary


def summary_markdown(looks: list[dict]) -> str:
    """decide.md: each look's seeds, cells trained and GPU-hours, then each finding's final status."""
    last = looks[-1]
    lines = ["# The sequential design's looks (`snakemake decide`)", "",
             "| look | seeds | cells read | next batch | GPU-h of the next batch | open findings |",
             "|---:|---:|---:|---:|---:|---|"]
    for x in looks:
        gpu = x["next"]["gpu_minutes"]
        gpu = "—" if gpu is None else f"{gpu / 60:.1f}"
        lines.append(f"| {x['look']} | {x['seeds']} | {len(x['cells'])} | {len(x['next']['cells'])} | {gpu} | "
                     f"{', '.join(x['open']) or '—'} |")
    lines += ["", f"Ended: {last['next']['why']}.", "",
              "| finding | model | verdict | seeds | seeds needed | status | look | why |",
              "|---|---|---|---:|---:|---|---:|---|"]
    for f in last["findings"]:
        need = "—" if f["seeds needed"] is None else f"{f['seeds needed']:.0f}"
        now = f" (now {f['now']})" if f.get("now") and f["now"] != f["verdict"] else ""
        lines.append(f"| {f['finding']} | {f['model']} | {f['verdict']}{now} | {f['seeds']} | {need} | {f['status']} | "
                     f"{f['look']} | {f['why']} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the plan's section


def plan_lines(cfg: Config, expected: dict[str, tuple[str, float]] | None = None, source: str = "") -> list[str]:
    """The plan's section on a decide run: the design, and per look the cells and GPU-hours of its
    batch at the cap (every finding that can spend seeds open through every look) and, given
    `expected` (finding → (verdict, seeds needed), e.g. a study's findings table named by `source`),
    where each finding stops at the first look at or past its projection."""
    try:
        d = design_of(cfg)
        design = design_file(cfg)
    except ConfigError as e:
        return ["", f"decide (target `decide`): not priced: {e}"]
    lines = ["", f"decide (target `decide`, docs/workflow.md): looks at {', '.join(map(str, d.looks))} seeds "
                 f"(grid.seeds, then decide.batch={cfg.decide.batch} up to decide.cap_seeds={d.cap}); each look's "
                 f"intervals at {100 * d.level:.2f} %"]

    def spend(open_until: dict[str, int]) -> list[tuple[int, float | None]]:
        out, done = [], first_look_cells(cfg)
        for k in range(1, len(d.looks)):
            new = set()
            for m in dict.fromkeys(cfg.grid.models):
                for f, until in open_until.items():
                    if until < d.looks[k]:
                        continue
                    for s, c in CELLS_READ[f] or ():
                        if cell_name(m, s, c) in design["grid"]:
                            new |= {cell_name(m, s, c, seed) for seed in design["seed_order"][:d.looks[k]]}
            new = [c for c in with_twins(sorted(new - set(done)), design["copies"]) if c not in done]
            out.append((len(new), batch_gpu_minutes(design, done, new)))
            done = done + new
        return out

    lines.append("  at the cap: every finding with cells to read open through every look (the most the looks can cost)")
    spendable = {f: d.cap for f, cells in CELLS_READ.items() if cells}
    at_cap = spend(spendable)
    rows = [("at the cap", at_cap)]
    if expected is not None:
        until = {}
        for f, (verdict, need) in expected.items():
            if CELLS_READ.get(f) and verdict == "undecided" and need == need and need <= d.cap:
                until[f] = next(n for n in d.looks if n >= need)
        rows.append(("expected", spend(until)))
        stops = ", ".join(f"{f} at {n}" for f, n in until.items()) or "none"
        lines.append(f"  expected: each finding stops at the first look at or past its projection, from {source or 'a study'}; "
                     f"open findings stop at: {stops}")
    h = lambda m: "—" if m is None else f"{m / 60:.1f}"  # noqa: E731
    lines.append("  look  seeds  " + "  ".join(f"{name}: cells, GPU-h" for name, _ in rows))
    for k in range(1, len(d.looks)):
        lines.append(f"  {k:>4}  {d.looks[k]:>5}  " + "  ".join(f"{r[k - 1][0]:>5} cells {h(r[k - 1][1]):>7}" for _, r in rows))
    for name, r in rows:
        total = None if any(m is None for _, m in r) else sum(m for _, m in r)
        lines.append(f"  after the first look, {name}: {sum(n for n, _ in r)} cells, {h(total)} GPU-h"
                     + ("" if cfg.decide.cap_gpu_hours <= 0 else f" (decide.cap_gpu_hours={cfg.decide.cap_gpu_hours:g} stops "
                                                                 "the looks before a batch would pass it)"))
    lines.append("  findings F11, F12, F13 read every cell's collapse points: not spent on; each look's cells: "
                 "dlcrepro/study/decide.py CELLS_READ")
    return lines
