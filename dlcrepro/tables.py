"""The paper tables: each a DataFrame, written as .tex (booktabs), .md and .csv, the paper's number
beside ours wherever PAPER.md reports one for that cell."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from . import analysis as A
from .findings import across_machines, findings_table, replicates_not_run
from .util import atomic_write_text

# PAPER.md's numbers by cell. The paper does not say which model F3–F7 and F10 refer to, so they
# stand beside every model's cell; F8's 1.9x is Qwen3-0.6B's.
PAPER_MULTIPLE = {
    ("fp8", "pg"): "13x (F3)",
    ("stale", "center"): "32x (F5)",
    ("stale", "is_center"): "2.1x (F6)",
    ("stale", "ppo_multi"): "699x (F7)",  # the paper's PPO read as 4 SGD steps per batch (findings.PAPER_PPO); `ppo` is pg's copy
    ("stale", "dlc"): "<=2x; 0.6B: 1.9x (F8)",
    ("stale", "is"): "115x (F10)",
    ("stale", "is_resync"): "2.6x (F10)",
}
PAPER_ACCURACY = {
    ("fp8", "center"): "46.5 % (F4)",
    ("stale", "center"): "12.2 % (F5)",
    ("stale", "is_center"): "32.0 % (F6)",
}
PAPER_ESS = {("stale",): "1.7B: ESS 11, Gaussian 14, IS leaves floor 11 (F2)"}
PAPER_RESYNC = {("stale", "dlc"): "1.7B: 20, 35, 36 (F9)"}
PAPER_OFF_SUPPORT = {"without": "~90 % at collapse, <=14 % before (F11)", "with": "<=11 % through step 40 (F11)"}
PAPER_SPEARMAN = {"off_support": "0.80 (F13)", "noise_floor_multiple": "0.74 (F13)"}


def _fmt(x, digits=3):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    return str(x)


def _mean_sd(mean, sd, digits=3):
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{_fmt(mean, digits)} ± {_fmt(sd, 2)}" if not (isinstance(sd, float) and math.isnan(sd)) else _fmt(mean, digits)


def _ci_text(mean, lo, hi, digits=3):
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{_fmt(mean, digits)} [{_fmt(lo, 2)}, {_fmt(hi, 2)}]"


def noise_floor_table(steps: pd.DataFrame, pr: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """Per cell: the mean over runs of M with its two-level bootstrap interval (runs, probe steps)."""
    b = A.multiple_bootstrap(steps, n_boot)
    s = b.merge(A.cell_stats(pr, "noise_floor_multiple")[A.CELL + ["n_valid"]], on=A.CELL, how="left")
    s["M (mean [95 % CI])"] = [_ci_text(m, lo, hi) for m, lo, hi in zip(s["mean"], s["ci_low"], s["ci_high"])]
    s["runs with a multiple"] = [f"{v}/{n}" for v, n in zip(s["n_valid"], s["n_runs"])]
    s["paper"] = [PAPER_MULTIPLE.get((a, b), "") for a, b in zip(s["sampler"], s["correction"])]
    return s[A.CELL + ["M (mean [95 % CI])", "runs with a multiple", "probe_steps", "paper", "mean", "ci_low", "ci_high"]]


def accuracy_table(pr: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """Per cell: θ_0's and the final test accuracy (mean [95 % CI] over runs) and the rise between them."""
    pr = pr.assign(rise=pr["final_test_accuracy"] - pr["initial_test_accuracy"])
    fin, start, rise = (A.mean_bootstrap(pr, c, n_boot) for c in ("final_test_accuracy", "initial_test_accuracy", "rise"))
    s = fin.merge(start, on=A.CELL, suffixes=("", "_start")).merge(rise, on=A.CELL, suffixes=("", "_rise"))
    s["at step 0"] = [_fmt(m) for m in s["mean_start"]]
    s["final (mean [95 % CI])"] = [_ci_text(m, lo, hi) for m, lo, hi in zip(s["mean"], s["ci_low"], s["ci_high"])]
    s["rise (mean [95 % CI])"] = [_ci_text(m, lo, hi) for m, lo, hi in zip(s["mean_rise"], s["ci_low_rise"], s["ci_high_rise"])]
    pr = pr.assign(_final=[_fmt(a) + (f" (diverged at {int(d)})" if d == d else "")
                           for a, d in zip(pr["final_test_accuracy"], pr["diverged_at_step"])])
    per_seed = pr.sort_values("seed").groupby(A.CELL)["_final"].apply("/".join).rename("final per seed")
    s = s.merge(per_seed.reset_index(), on=A.CELL, how="left")
    s["paper"] = [PAPER_ACCURACY.get((a, b), "") for a, b in zip(s["sampler"], s["correction"])]
    return s[A.CELL + ["at step 0", "final (mean [95 % CI])", "rise (mean [95 % CI])", "final per seed", "paper", "mean", "ci_low", "ci_high"]]


def ess_crossing_table(pr: pd.DataFrame, correction: str = "is") -> pd.DataFrame:
    """Per model x lagged sampler: empirical vs Gaussian crossing and the step `is` leaves the floor, per seed."""
    d = pr.loc[pr["sampler"].isin(["stale", "fp8_stale"]) & (pr["correction"] == correction)]
    rows = []
    for (model, sampler), g in d.groupby(["model", "sampler"]):
        g = g.sort_values("seed")
        lst = lambda c: ", ".join(_fmt(v) for v in g[c])  # noqa: E731
        rows.append({
            "model": model, "sampler": sampler, "correction": correction,
            "ESS < 1/2 at step (per seed)": lst("ess_crossing_step"),
            "Gaussian predicts (per seed)": lst("ess_gauss_crossing_step"),
            f"{correction} leaves the floor (per seed)": lst("leave_floor_step"),
            "paper": PAPER_ESS.get((sampler,), ""),
        })
    return pd.DataFrame(rows)


def resync_table(pr: pd.DataFrame) -> pd.DataFrame:
    d = pr.loc[pr["correction"].isin(A.RESYNC_CORRECTIONS)].sort_values(A.RUN)
    out = d[A.RUN].copy()
    out["resync steps"] = [", ".join(map(str, json.loads(s))) or "none" for s in d["resync_steps"]]
    out["paper"] = [PAPER_RESYNC.get((s, c), "") for s, c in zip(d["sampler"], d["correction"])]
    return out


def off_support_table(drops: pd.DataFrame) -> pd.DataFrame:
    t = A.off_support_summary(drops)
    t["paper"] = [PAPER_OFF_SUPPORT[r] for r in t["resync"]]
    return t


def zoo_table(steps: pd.DataFrame, pr: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """Per model × sampler, the grid's corrections ranked by M (lowest first: closest to on-policy
    training), beside their final accuracy and its rank (highest first), and what each correction
    did to its tokens: the mean over steps of its truncated and dropped token shares, and its
    largest token weight over the runs (`corr_*` metrics columns; n/a for runs written before them)."""
    m = noise_floor_table(steps, pr, n_boot)
    acc = accuracy_table(pr, n_boot)
    t = m[A.CELL + ["M (mean [95 % CI])", "mean", "ci_low", "ci_high"]].merge(
        acc[A.CELL + ["final (mean [95 % CI])", "mean"]].rename(columns={"mean": "accuracy_mean"}), on=A.CELL, how="outer")
    diag = {"corr_clipped_share": "mean", "corr_masked_share": "mean", "corr_weight_max": "max"}
    have = [c for c in diag if c in steps.columns]
    d = steps.groupby(A.CELL)[have].agg({c: diag[c] for c in have}).reset_index() if have else steps[A.CELL].drop_duplicates()
    t = t.merge(d, on=A.CELL, how="left").merge(diverged_runs(pr), on=A.CELL, how="left")
    t["M (mean [95 % CI])"] = t["M (mean [95 % CI])"].fillna("n/a")  # a cell without a metrics row: every run diverged at step 1
    rows = []
    for _, g in t.groupby(["model", "sampler"], sort=True):
        g = g.sort_values(["mean", "correction"], na_position="last").copy()
        g["rank by M"] = range(1, len(g) + 1)
        g["rank by accuracy"] = g["accuracy_mean"].rank(ascending=False, method="min").astype("Int64")
        rows.append(g)
    t = pd.concat(rows, ignore_index=True)
    t["truncated tokens"] = [_fmt(v) for v in t.get("corr_clipped_share", pd.Series(math.nan, index=t.index))]
    t["dropped tokens"] = [_fmt(v) for v in t.get("corr_masked_share", pd.Series(math.nan, index=t.index))]
    t["largest weight"] = [_fmt(v) for v in t.get("corr_weight_max", pd.Series(math.nan, index=t.index))]
    return t[["model", "sampler", "rank by M", "correction", "M (mean [95 % CI])", "final (mean [95 % CI])", "rank by accuracy",
              "truncated tokens", "dropped tokens", "largest weight", "diverged", "mean", "ci_low", "ci_high"]]


def diverged_runs(pr: pd.DataFrame) -> pd.DataFrame:
    """Per cell, its runs that diverged ("seed 1 at step 9"; "none"): their final accuracy counts as 0
    and their M is over their probe steps before the divergence."""
    text = pr.sort_values("seed").groupby(A.CELL).apply(
        lambda g: ", ".join(f"seed {s} at step {int(a)}" for s, a in zip(g["seed"], g["diverged_at_step"]) if a == a) or "none",
        include_groups=False)
    return text.rename("diverged").reset_index()


def spearman_out(steps: pd.DataFrame, drops: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    t = A.spearman_table(steps, drops, n_boot=n_boot)
    t["rho [95 % CI]"] = [f"{_fmt(r)} [{_fmt(lo)}, {_fmt(hi)}]" for r, lo, hi in zip(t["rho"], t["ci_low"], t["ci_high"])]
    t["paper"] = [PAPER_SPEARMAN[m] for m in t["measure"]]
    return t


# ----------------------------------------------------------------------------- writers


def _tex_escape(s: str) -> str:
    for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"), ("±", r"$\pm$"),
                 ("<=", r"$\le$"), ("->", r"$\to$"), ("~", r"$\sim$")):
        s = s.replace(a, b)
    return s


def to_tex(df: pd.DataFrame, caption: str) -> str:
    cols = list(df.columns)
    lines = [r"\begin{table}[t]", r"\centering", rf"\caption{{{_tex_escape(caption)}}}", r"\begin{tabular}{" + "l" * len(cols) + "}", r"\toprule",
             " & ".join(_tex_escape(str(c)) for c in cols) + r" \\", r"\midrule"]
    for _, r in df.iterrows():
        lines.append(" & ".join(_tex_escape(_fmt(v)) for v in r) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}", ""]
    return "\n".join(lines)


def to_md(df: pd.DataFrame, caption: str) -> str:
    cols = list(df.columns)
    out = [f"{caption}", "", "| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        out.append("| " + " | ".join(_fmt(v).replace("|", "/") for v in r) + " |")
    return "\n".join(out) + "\n"


def csv_only(df: pd.DataFrame) -> list[str]:
    """The columns a table keeps for programs (the .csv) and leaves out of the .md and .tex: raw
    numbers its text columns already show, and the findings' headline numbers (the summary figure's)."""
    numeric = ("mean", "sd", "ci_low", "ci_high", "unit", "paper value")
    return [c for c in df.columns if c in numeric or (c.startswith("seeds ") and c.endswith((" value", " low", " high")))]


def write_table(df: pd.DataFrame, out: Path, name: str, caption: str) -> None:
    shown = df.drop(columns=csv_only(df))
    atomic_write_text(out / f"{name}.csv", df.to_csv(index=False))
    atomic_write_text(out / f"{name}.md", to_md(shown, caption))
    atomic_write_text(out / f"{name}.tex", to_tex(shown, caption))


CAPTIONS = {
    "noise_floor": "Deviation from on-policy training in multiples of the noise floor: per run M = sum dev / sum floor over its probe steps; per cell the mean over runs with a 95 % bootstrap interval (resampling runs, and probe steps within each run).",
    "accuracy": "Test accuracy ({measure}) of θ_0 and at the last step, and the rise between them: mean [95 % bootstrap interval over runs].",
    "ess_crossing": "First step with lag ESS < 1/2 (empirical, on the fresh batch), the step the Gaussian prediction exp(-Var lag) crosses, and the step `is` leaves the floor (3-step moving average of dev/floor > 2).",
    "resync": "Steps at which each run with resync resynchronized its sampler.",
    "off_support": "Off-support share (tokens of the trainer's own responses with probability < 1e-3 under the initial policy) before / at collapse points (accuracy drop >= half the bf16/pg reference), beside the sampler-side KL. Copied cells (computed_as) count once.",
    "spearman": "Spearman correlation with the accuracy drop over (run, eval step) pairs of non-reference runs, copied cells counted once; 95 % bootstrap intervals resample runs.",
    "probe_density": "How the cells' M intervals narrow with probe steps: the same runs with only every k-th probe step kept (probes never change a run).",
    "zoo": "The grid's corrections ranked per sampler by the noise-floor multiple M (mean over runs [95 % bootstrap interval]; rank 1 = closest to on-policy training), beside the final test accuracy (mean [95 % CI]) and its rank, the mean share of tokens each correction truncated or dropped and its largest token weight, and the runs that diverged (weights not finite after an update; final accuracy 0).",
    "findings": "Findings of the paper, each checked by the stated rule in each replicate (a group of seeds): seen = holds in every replicate; "
                "an agreement holds only with its whole interval inside the stated margin; seen on one machine = seen on one kind of CPU "
                "and not on another (docs/method.md#findings-and-replicates). Rules of commit {rules}; computed on {machine}.",
}


def absent(df: pd.DataFrame, why: str) -> pd.DataFrame:
    """`df`, or where it has no rows (the grid lacks the cells it needs) a one-row table saying why."""
    return df if len(df) else pd.DataFrame({"not in this grid": [why]})


def write_all(steps: pd.DataFrame, runs: pd.DataFrame, out: Path, n_boot: int = 1000, replicates: list[list[int]] | None = None,
              other_machines: list[pd.DataFrame] | None = None) -> dict[str, pd.DataFrame]:
    """Every table into `out`; `other_machines`: findings tables of the same grid from other CPU
    kinds, whose verdicts turn a finding seen on one kind only into "seen on one machine"."""
    out = Path(out)
    pr = A.per_run(steps, runs)
    drops = A.distinct_runs(A.accuracy_drops(steps), runs)
    distinct_steps = A.distinct_runs(steps, runs)
    t = {
        "noise_floor": noise_floor_table(steps, pr, n_boot),
        "accuracy": accuracy_table(pr, n_boot),
        "ess_crossing": absent(ess_crossing_table(pr), "no `is` run under a lagged sampler (stale, fp8_stale)"),
        "resync": absent(resync_table(pr), "no run of a correction with resync (dlc, is_resync)"),
        "off_support": absent(off_support_table(drops), "no accuracy drops: they need the bf16/pg reference and another cell"),
        "spearman": absent(spearman_out(distinct_steps, drops, n_boot), "no accuracy drops: they need the bf16/pg reference and another cell"),
        "probe_density": A.interval_width_by_probe_density(steps, n_boot=n_boot),
        "findings": across_machines(findings_table(steps, runs, replicates, n_boot), other_machines or []),
        "zoo": zoo_table(steps, pr, n_boot),
    }
    for name, df in t.items():
        write_table(df, out, name, caption(name, df).replace("{measure}", A.eval_measure(steps, runs)))
    return t


def caption(name: str, df: pd.DataFrame) -> str:
    """A table's caption; the findings table's also names the replicates that did not run (their
    column says "not run"), since its verdicts then stand on fewer replicates than the config asks for."""
    text = CAPTIONS[name]
    if name == "findings" and len(df) and {"rules", "machine"} <= set(df.columns):
        text = text.replace("{rules}", str(df["rules"].iloc[0])).replace("{machine}", str(df["machine"].iloc[0]))
    missing = replicates_not_run(df) if name == "findings" else []
    if not missing:
        return text
    return text + f" Not run in this grid: {'; '.join(missing)}; each verdict names the replicates it lacks."
