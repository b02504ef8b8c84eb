"""Aggregates over runs and cells (docs/method.md#aggregates-over-runs-and-cells): functions from tables to tables.

`steps` is the per-step metrics of every run, with the run's identity columns RUN;
`runs` has one row per run. Nothing here reads or writes files except `collect`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import pandas as pd
import yaml

from .intervals import t_interval
from ..core.registry import resync_corrections

RUN = ["model", "sampler", "correction", "seed"]
CELL = ["model", "sampler", "correction"]
REFERENCE = ("bf16", "pg")  # on-policy training: the run every accuracy drop is measured against
RESYNC_CORRECTIONS = resync_corrections()  # from the registry: dlc, is_resync
LEAVE_FLOOR_RATIO = 2.0  # a 3-step moving average of dev/floor above this has left the floor
LEAVE_FLOOR_WINDOW = 3
ESS_HALF = 0.5


def eval_setting(cell_dir: Path, model: str) -> dict:
    """How a run's test_accuracy was measured, from the config.yaml its cell wrote: train.eval_on,
    eval_mode, eval_samples (the model's train overrides applied) and eval_problems, the number of
    problems evaluated (the RL pool's or the held-out test set's). {} without that file."""
    p = cell_dir / "config.yaml"
    if not p.exists():
        return {}
    cfg = (yaml.safe_load(p.read_text()) or {}).get("config") or {}
    train = {**cfg.get("train", {}), **((cfg.get("models", {}).get(model) or {}).get("train") or {})}
    if "eval_on" not in train:
        return {}
    task = cfg.get("task", {})
    n_train = task.get("n_train", math.nan)
    pool = min(train.get("pool_size") or n_train, n_train)
    return {"eval_on": train["eval_on"], "eval_mode": train.get("eval_mode", ""),
            "eval_samples": train.get("eval_samples", math.nan),
            "eval_problems": pool if train["eval_on"] == "pool" else task.get("n_test", math.nan)}


def metrics_problem(cell_dir: Path) -> str | None:
    """What is wrong with a finished cell's summary.json and metrics.parquet, or None: the table's
    size and sha256 against what its summary records (`metrics_file`; a summary from before that
    record: the table must at least read)."""
    cell_dir = Path(cell_dir)
    try:
        s = json.loads((cell_dir / "summary.json").read_text())
    except (OSError, ValueError) as e:
        return f"summary.json does not read ({e})"
    m = cell_dir / "metrics.parquet"
    if not m.exists():
        return "metrics.parquet is missing"
    want = s.get("metrics_file")
    if want:
        from ..core.util import file_digest

        got = file_digest(m)
        if got != {k: want.get(k) for k in ("bytes", "sha256")}:
            return (f"metrics.parquet is {got['bytes']:,} bytes with sha256 {got['sha256'][:12]}, not the "
                    f"{want.get('bytes', 0):,} bytes with sha256 {str(want.get('sha256'))[:12]} its summary.json records")
        return None
    try:
        pd.read_parquet(m)
    except Exception as e:  # noqa: BLE001 - any reader error: the file is not a table
        return f"metrics.parquet does not read ({type(e).__name__}: {e})"
    return None


def damaged_cells_message(problems: dict[Path, str], rerun: str | None) -> str:
    """The error `collect` stops with: each damaged cell and why, and the line that reruns them."""
    lines = [f"collect: {len(problems)} finished cell(s) with a damaged file; nothing was collected:"]
    lines += [f"  {d}: {why}" for d, why in problems.items()]
    dirs = " ".join(str(d) for d in problems)
    lines.append(f"Rerun them: rm -r {dirs} && {rerun}" if rerun else
                 f"Rerun them: rm -r {dirs}, then the snakemake command that made them (those cells train again, then collect)")
    return "\n".join(lines)


def collect(summary_paths: Iterable[str | Path], rerun: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read each run's summary.json and the metrics.parquet beside it: (steps, runs), the runs with
    how their test accuracy was measured where the cell's config.yaml says (`eval_setting`). Every
    cell is checked first (`metrics_problem`): a damaged one stops it with DamagedFileError naming
    each such cell and the line that reruns them (`rerun`: the snakemake command that made them)."""
    from ..core.util import DamagedFileError

    summary_paths = [Path(p) for p in summary_paths]
    problems = {p.parent: why for p in summary_paths if (why := metrics_problem(p.parent))}
    if problems:
        raise DamagedFileError(damaged_cells_message(problems, rerun))
    steps, runs = [], []
    for p in summary_paths:
        s = json.loads(p.read_text())
        m = pd.read_parquet(p.parent / "metrics.parquet")
        for k in RUN:
            m.insert(0, k, s[k]) if k not in m else None
        steps.append(m)
        runs.append({k: s[k] for k in RUN} | {
            "final_test_accuracy": s["final_test_accuracy"],
            "initial_test_accuracy": s.get("initial_test_accuracy", math.nan),  # θ_0's, before step 1
            **{f"initial_{k}": v for k, v in s.get("initial_accuracies", {}).items() if k != "test_accuracy"},
            "resync_steps": json.dumps(s["resync_steps"]),
            # a diverged run's first step without a row (its final accuracy is then 0); NaN if none
            "diverged_at_step": float(s.get("diverged_at_step") or math.nan),
            "wall_seconds": s.get("wall_seconds", math.nan),
            "computed_as": s.get("computed_as", ""),  # the run whose metrics these are (grid.computed_as)
            **eval_setting(p.parent, s["model"]),
        })
    if not steps:
        raise ValueError("collect: no runs given")
    return pd.concat(steps, ignore_index=True), pd.DataFrame(runs)


# ----------------------------------------------------------------------------- per run


def noise_floor_multiple(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: M = Σ_t dev_t / Σ_t floor_t over probe steps whose floor is > 0 (a step whose floor is
    0 — every advantage 0 — adds nothing to either sum); NaN where every floor is 0."""

    def one(g):
        g = g.loc[g["floor"] > 0]
        return float(g["dev"].sum() / g["floor"].sum()) if len(g) else math.nan

    return steps.groupby(RUN).apply(one, include_groups=False).rename("noise_floor_multiple").reset_index()


def leave_floor_step(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: first step whose trailing 3-step moving average of dev/floor exceeds 2 (NaN steps skipped)."""

    def one(g):
        g = g.sort_values("step")
        ma = g["dev_ratio"].rolling(LEAVE_FLOOR_WINDOW, min_periods=1).mean()
        hit = g.loc[ma > LEAVE_FLOOR_RATIO, "step"]
        return int(hit.iloc[0]) if len(hit) else math.nan

    return steps.groupby(RUN).apply(one, include_groups=False).rename("leave_floor_step").reset_index()


def lag_ess_seen(steps: pd.DataFrame) -> pd.Series:
    """The lag ESS of each step's fresh batch: before a resync replaced it, where one did."""
    return steps["ess_lag_presync"].where(steps["ess_lag_presync"].notna(), steps["ess_lag"])


def ess_crossings(steps: pd.DataFrame) -> pd.DataFrame:
    """Per run: first step with lag ESS < 1/2, and first step the Gaussian prediction exp(−Var λ) is."""
    df = steps.assign(_ess=lag_ess_seen(steps))

    def first(g, col):
        hit = g.loc[g[col] < ESS_HALF, "step"]
        return int(hit.min()) if len(hit) else math.nan

    return (
        df.groupby(RUN)
        .apply(lambda g: pd.Series({"ess_crossing_step": first(g, "_ess"), "ess_gauss_crossing_step": first(g, "ess_lag_gauss")}),
               include_groups=False)
        .reset_index()
    )


def per_run(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run with every per-run aggregate (`diverged_at_step` NaN for runs collected
    before it was recorded)."""
    out = runs.copy()
    if "diverged_at_step" not in out:
        out["diverged_at_step"] = math.nan
    for f in (noise_floor_multiple, leave_floor_step, ess_crossings):
        out = out.merge(f(steps), on=RUN, how="left")
    return out


# ----------------------------------------------------------------------------- accuracy drops and collapse


def accuracy_drops(steps: pd.DataFrame, reference: tuple[str, str] = REFERENCE) -> pd.DataFrame:
    """Per (non-reference run, eval step): drop = reference accuracy − this run's; collapse: drop ≥ ½ reference.

    The reference is the `bf16`/`pg` run of the same model and seed at the same step.
    """
    ev = steps.loc[steps["test_accuracy"].notna()]
    is_ref = (ev["sampler"] == reference[0]) & (ev["correction"] == reference[1])
    ref = ev.loc[is_ref, ["model", "seed", "step", "test_accuracy"]].rename(columns={"test_accuracy": "reference_accuracy"})
    cols = RUN + ["step", "test_accuracy", "off_support", "kl_sampler", "resync"]
    out = ev.loc[~is_ref, cols].merge(ref, on=["model", "seed", "step"], how="inner")
    out["drop"] = out["reference_accuracy"] - out["test_accuracy"]
    out["collapse"] = (out["drop"] >= 0.5 * out["reference_accuracy"]) & (out["reference_accuracy"] > 0)
    return out


def cumulative_multiple(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (run, step): M up to that step, Σ_{t≤s} dev_t / Σ_{t≤s} floor_t (NaN while the floor sum is 0)."""
    df = steps.sort_values(RUN + ["step"])[RUN + ["step", "dev", "floor"]].copy()
    counted = df["floor"] > 0  # a zero floor adds nothing to either sum
    df["dev"], df["floor"] = df["dev"].where(counted, 0.0), df["floor"].where(counted, 0.0)
    g = df.groupby(RUN)
    dev, floor = g["dev"].cumsum(), g["floor"].cumsum()
    df["multiple_to_step"] = (dev / floor).where(floor > 0)
    return df[RUN + ["step", "multiple_to_step"]]


OFF_SUPPORT_COLUMNS = ["model", "resync", "runs", "collapse_points", "off_support_before_max", "off_support_at_collapse_mean",
                       "kl_sampler_at_collapse_mean", "kl_sampler_healthy_min", "kl_sampler_healthy_max"]


def off_support_summary(drops: pd.DataFrame, resync_corrections=RESYNC_CORRECTIONS) -> pd.DataFrame:
    """Off-support share before / at collapse points, without and with resync, beside kl_sampler.

    Before: the largest share at eval steps before a run's first collapse point (all eval steps of
    runs that never collapse). At: the mean share at collapse points. kl_sampler at collapse
    points is set beside its range over runs that never collapse (the healthy runs).
    """
    rows = []
    d = drops.copy()
    d["with_resync"] = d["correction"].isin(resync_corrections)
    first_collapse = d.loc[d["collapse"]].groupby(RUN)["step"].min().rename("first_collapse")
    d = d.merge(first_collapse.reset_index(), on=RUN, how="left")
    healthy_runs = d.groupby(RUN)["collapse"].transform("sum") == 0
    for model, dm in list(d.groupby("model")) + [("pooled", d)]:
        for resync, dr in dm.groupby("with_resync"):
            before = dr.loc[dr["first_collapse"].isna() | (dr["step"] < dr["first_collapse"]), "off_support"]
            at = dr.loc[dr["collapse"]]
            hk = d.loc[healthy_runs & ((d["model"] == model) | (model == "pooled")), "kl_sampler"]
            rows.append({
                "model": model,
                "resync": "with" if resync else "without",
                "runs": dr.groupby(RUN).ngroups,
                "collapse_points": int(len(at)),
                "off_support_before_max": float(before.max()) if len(before) else math.nan,
                "off_support_at_collapse_mean": float(at["off_support"].mean()) if len(at) else math.nan,
                "kl_sampler_at_collapse_mean": float(at["kl_sampler"].mean()) if len(at) else math.nan,
                "kl_sampler_healthy_min": float(hk.min()) if len(hk) else math.nan,
                "kl_sampler_healthy_max": float(hk.max()) if len(hk) else math.nan,
            })
    return pd.DataFrame(rows, columns=OFF_SUPPORT_COLUMNS)


# ----------------------------------------------------------------------------- Spearman


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ: the Pearson correlation of the average ranks of x and y (scipy's spearmanr, a
    tenth of its time: the bootstraps call it tens of thousands of times), over pairs without a NaN;
    NaN with fewer than 3 pairs or a constant variable."""
    ok = ~(np.isnan(x) | np.isnan(y))
    if ok.sum() < 3 or np.all(x[ok] == x[ok][0]) or np.all(y[ok] == y[ok][0]):
        return math.nan
    from scipy.stats import rankdata  # imported here: training jobs import this module and never need scipy

    rx, ry = rankdata(x[ok]), rankdata(y[ok])
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float(np.dot(rx, ry) / math.sqrt(np.dot(rx, rx) * np.dot(ry, ry)))


MOST_RESAMPLES = 32_000  # bootstrap_runs draws no more than this many resamples to settle an end


class Bootstrapped(NamedTuple):
    """A statistic and its 95 % percentile-bootstrap interval over runs, with the Monte-Carlo error of
    the interval's ends (the larger of the two) and the number of resamples drawn."""

    value: float
    low: float
    high: float
    mc_error: float = math.nan
    resamples: int = 0


def percentile_mc_error(boots: np.ndarray, q: float) -> float:
    """The Monte-Carlo standard error of the q-th percentile of `boots` as an estimate of the
    bootstrap distribution's: half the distance between the order statistics ±√(B q (1 − q)) ranks
    around it (the binomial spread of how many resamples fall below a quantile)."""
    b = np.sort(boots)
    k, s = q * (len(b) - 1), math.sqrt(len(b) * q * (1 - q))
    lo, hi = int(max(0, math.floor(k - s))), int(min(len(b) - 1, math.ceil(k + s)))
    return float((b[hi] - b[lo]) / 2)


def bootstrap_runs(df: pd.DataFrame, cols: list[str], stat, n_boot: int = 1000, seed: int = 0, margins=(),
                   level: float = 0.95) -> Bootstrapped:
    """`stat` of the `(rows, len(cols))` array of `df`'s columns, and its `level` percentile interval
    resampling runs (not rows) with replacement; resamples where `stat` is NaN are dropped. With
    `margins`, resamples are added (doubling, up to MOST_RESAMPLES) until each end's Monte-Carlo error
    (`percentile_mc_error`) is below a tenth of its distance to the nearest margin, or 0, so the side
    of a margin an end falls on is not the draw's; `mc_error` says how far that got."""
    value = stat(df[cols].to_numpy(float))
    groups = [g[cols].to_numpy(float) for _, g in df.groupby(RUN)]
    if len(groups) < 2 or math.isnan(value):
        return Bootstrapped(value, math.nan, math.nan)
    rng = np.random.default_rng(seed)

    def draw(k: int) -> list[float]:
        return [stat(np.concatenate([groups[i] for i in rng.integers(len(groups), size=len(groups))])) for _ in range(k)]

    boots = np.array([b for b in draw(n_boot) if not math.isnan(b)])
    while True:
        if not len(boots):
            return Bootstrapped(value, math.nan, math.nan, math.nan, n_boot)
        tail = (1 - level) / 2
        lo, hi = (float(v) for v in np.percentile(boots, [100 * tail, 100 * (1 - tail)]))
        err = max(percentile_mc_error(boots, tail), percentile_mc_error(boots, 1 - tail))
        distance = min((abs(e - m) for e in (lo, hi) for m in margins), default=math.inf)
        if err == 0 or err < distance / 10 or len(boots) >= MOST_RESAMPLES:  # err 0: the ends are exact
            return Bootstrapped(value, lo, hi, err, len(boots))
        boots = np.concatenate([boots, [b for b in draw(len(boots)) if not math.isnan(b)]])


def bootstrap_spearman(df: pd.DataFrame, xcol: str, ycol: str, n_boot: int = 1000, seed: int = 0) -> Bootstrapped:
    """ρ(x, y) over all rows and its 95 % percentile interval, resampling runs (not steps)."""
    return bootstrap_runs(df, [xcol, ycol], lambda a: spearman(a[:, 0], a[:, 1]), n_boot, seed)


def spearman_difference(df: pd.DataFrame, xcol: str, zcol: str, ycol: str, n_boot: int = 1000, seed: int = 0,
                        margins=(), level: float = 0.95) -> Bootstrapped:
    """ρ(x, y) − ρ(z, y) over all rows and its `level` percentile interval, both ρ on the same
    resamples of runs; with `margins`, resampled until the ends' Monte-Carlo error is a tenth of their
    distance to them (`bootstrap_runs`)."""
    return bootstrap_runs(df, [xcol, zcol, ycol], lambda a: spearman(a[:, 0], a[:, 2]) - spearman(a[:, 1], a[:, 2]), n_boot, seed,
                          margins, level)


def spearman_table(steps: pd.DataFrame, drops: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """ρ(off_support, drop) and ρ(M up to the step, drop) over (run, eval step) pairs, per model and pooled."""
    pairs = drops.merge(cumulative_multiple(steps), on=RUN + ["step"], how="left")
    rows = []
    for model, d in list(pairs.groupby("model")) + [("pooled", pairs)]:
        for name, col in (("off_support", "off_support"), ("noise_floor_multiple", "multiple_to_step")):
            rho, lo, hi, *_ = bootstrap_spearman(d, col, "drop", n_boot, seed)
            rows.append({"model": model, "measure": name, "rho": rho, "ci_low": lo, "ci_high": hi,
                         "pairs": int(d[[col, "drop"]].dropna().shape[0]), "runs": d.groupby(RUN).ngroups})
    return pd.DataFrame(rows)


# ----------------------------------------------------------------------------- intervals and replicates


def distinct_runs(df: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """`df` without the rows of runs that are copies of another run (`computed_as`, grid.py): a copied
    cell's numbers are its source's, so counting it again in a correlation, a bootstrap or a collapse
    count would weigh one run twice and narrow the intervals."""
    copies = runs.loc[runs["computed_as"].fillna("") != "", RUN]
    if copies.empty:
        return df
    marked = df.merge(copies.assign(_copy=True), on=RUN, how="left")
    return df.loc[marked["_copy"].isna().to_numpy()]


def mean_interval(per_run_df: pd.DataFrame, col: str) -> pd.DataFrame:
    """Per cell: the mean over runs of a per-run column and its 95 % Student-t interval over runs
    (intervals.t_interval: mean ± t_{0.975, n−1} · sd/√n, exact), with the spread `sd`, the cell's
    runs (`n_runs`) and those with a value (`n_valid`: NaN runs are counted, not averaged). A cell
    with one value has no interval (NaN ends); copies of one cell get the same interval."""
    rows = []
    for key, g in per_run_df.groupby(CELL):
        mean, lo, hi, sd, n = t_interval(g[col].to_numpy(float))
        rows.append(dict(zip(CELL, key)) | {"mean": mean, "ci_low": lo, "ci_high": hi, "sd": sd, "n_runs": int(len(g)),
                                             "n_valid": n})
    return pd.DataFrame(rows, columns=CELL + ["mean", "ci_low", "ci_high", "sd", "n_runs", "n_valid"])


def multiple_interval(steps: pd.DataFrame, per_run_df: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per cell: the mean over runs of M = Σ dev / Σ floor and its 95 % t-interval over runs
    (`mean_interval` of each run's M: a run's M already carries its probe steps' noise, so the spread
    of the runs' M is the whole spread), `probe_steps`, the probe steps (floor > 0) that entered, and
    `probed_steps`, the steps probed (a floor measured; fewer enter where a run collapsed: floor 0).
    `per_run_df` (per_run's table) gives every run of the cell, those without a multiple among them;
    by default the runs with a row in `steps`."""
    pr = per_run_df if per_run_df is not None else noise_floor_multiple(steps)
    out = mean_interval(pr, "noise_floor_multiple")
    for col, rows in (("probe_steps", steps["floor"] > 0), ("probed_steps", steps["floor"].notna())):
        out = out.merge(steps.loc[rows].groupby(CELL).size().rename(col).reset_index(), on=CELL, how="left")
        out[col] = out[col].fillna(0).astype(int)
    return out


def thin_probes(steps: pd.DataFrame, every: int) -> pd.DataFrame:
    """The steps table as if probes had been drawn only at every `every`-th probe step of each run:
    probes never change a run's trajectory, so this is exactly the sparser run's dev/floor."""
    probe_steps = steps.loc[steps["floor"].notna(), "step"].drop_duplicates().sort_values()
    keep = set(probe_steps.iloc[every - 1 :: every])
    out = steps.copy()
    drop = out["floor"].notna() & ~out["step"].isin(keep)
    out.loc[drop, ["dev", "floor", "dev_ratio"]] = math.nan
    return out


def interval_width_by_probe_density(steps: pd.DataFrame, thinning=(1, 2, 5)) -> pd.DataFrame:
    """How the cells' M intervals narrow with more probe steps: for each thinning factor, the probe
    steps per run left and the median over cells of the t-interval's width relative to its mean."""
    rows = []
    for k in thinning:
        b = multiple_interval(thin_probes(steps, k))
        rel = (b["ci_high"] - b["ci_low"]) / b["mean"]
        per_run = b["probe_steps"] / b["n_runs"]
        rows.append({"probe every k-th probe step": k, "probe steps per run": float(per_run.median()) if len(b) else math.nan,
                     "median relative CI width": float(rel.median()) if len(b) else math.nan,
                     "cells": int(len(b))})
    return pd.DataFrame(rows)


HELDOUT_GREEDY = "held-out accuracy (greedy)"  # heldout_accuracy_greedy; the paper config's test_accuracy


def accuracy_name(on: str, mode: str) -> str:
    """The name of an accuracy by what it measures: "RL-pool accuracy (sampled)", "held-out accuracy
    (greedy)", ... (train.eval_on: pool or test; train.eval_mode: sampled or greedy)."""
    return f"{'RL-pool' if on == 'pool' else 'held-out'} accuracy ({mode})"


def accuracy_names(steps: pd.DataFrame, runs: pd.DataFrame | None) -> str:
    """The short name of what `test_accuracy` measures (accuracy_name), or "test accuracy" where the
    runs differ or do not record it."""
    return eval_measure(steps, runs).split(":")[0]


def eval_measure(steps: pd.DataFrame, runs: pd.DataFrame | None) -> str:
    """What `test_accuracy` measures, e.g. "RL-pool accuracy (sampled): 16 problems, 2 answers each
    at T = 1": from the runs table (collect reads each cell's config), else from which accuracy
    column test_accuracy repeats and whether a held-out accuracy was measured beside it."""
    cols = ("eval_on", "eval_mode", "eval_samples", "eval_problems")
    if runs is not None and set(cols) <= set(runs) and runs["eval_on"].notna().all():
        settings = runs[list(cols)].drop_duplicates()
        if len(settings) > 1:
            return "test accuracy: train.eval_on / eval_mode differ between runs"
        on, mode, k, n = settings.iloc[0]
        how = f"{int(k)} answers each at T = 1" if mode == "sampled" else "one greedy answer each"
        return f"{accuracy_name(on, mode)}: {int(n)} problems, {how}"
    ev = steps.loc[steps["test_accuracy"].notna()]
    modes = [m for m in ("sampled", "greedy") if f"accuracy_{m}" in ev and (ev[f"accuracy_{m}"] == ev["test_accuracy"]).all()]
    if len(modes) != 1:
        return "test accuracy: train.eval_on / eval_mode not recorded"
    pool = "heldout_accuracy_greedy" in ev and ev["heldout_accuracy_greedy"].notna().any()
    return accuracy_name("pool" if pool else "test", modes[0])


def final_heldout(steps: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per run: the held-out accuracy (greedy) of θ_0 and at its last eval step, where it was
    measured beside a pool accuracy (NaN where not); 0 at the end for a run that diverged, as its
    final test accuracy (docs/method.md#diverged-runs)."""
    out = runs[RUN].copy()
    out["initial_heldout"] = runs.get("initial_heldout_accuracy_greedy", pd.Series(math.nan, index=runs.index)).to_numpy(float)
    if "heldout_accuracy_greedy" in steps:
        last = (steps.loc[steps["heldout_accuracy_greedy"].notna()].sort_values("step")
                .groupby(RUN)["heldout_accuracy_greedy"].last().rename("final_heldout").reset_index())
        out = out.merge(last, on=RUN, how="left")
    else:
        out["final_heldout"] = math.nan
    if "diverged_at_step" in runs and out["final_heldout"].notna().any():  # held-out measured in this grid
        out.loc[runs["diverged_at_step"].notna().to_numpy(), "final_heldout"] = 0.0
    return out
