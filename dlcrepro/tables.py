"""The paper tables: each a DataFrame, written as .tex (booktabs), .md and .csv, the paper's number
beside ours wherever PAPER.md reports one for that cell."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from . import analysis as A
from .util import atomic_write_text

# PAPER.md's numbers by cell. The paper does not say which model F3–F7 and F10 refer to, so they
# stand beside every model's cell; F8's 1.9x is Qwen3-0.6B's.
PAPER_MULTIPLE = {
    ("fp8", "pg"): "13x (F3)",
    ("stale", "center"): "32x (F5)",
    ("stale", "is_center"): "2.1x (F6)",
    ("stale", "ppo"): "699x (F7)",
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


def noise_floor_table(pr: pd.DataFrame) -> pd.DataFrame:
    s = A.cell_stats(pr, "noise_floor_multiple")
    s["M (mean ± sd)"] = [_mean_sd(m, d) for m, d in zip(s["mean"], s["sd"])]
    s["runs with a multiple"] = [f"{v}/{n}" for v, n in zip(s["n_valid"], s["n_runs"])]
    s["paper"] = [PAPER_MULTIPLE.get((a, b), "") for a, b in zip(s["sampler"], s["correction"])]
    return s[A.CELL + ["M (mean ± sd)", "runs with a multiple", "paper", "mean", "sd"]]


def accuracy_table(pr: pd.DataFrame) -> pd.DataFrame:
    s = A.cell_stats(pr, "final_test_accuracy")
    s["final test accuracy (mean ± sd)"] = [_mean_sd(m, d) for m, d in zip(s["mean"], s["sd"])]
    s["paper"] = [PAPER_ACCURACY.get((a, b), "") for a, b in zip(s["sampler"], s["correction"])]
    return s[A.CELL + ["final test accuracy (mean ± sd)", "paper", "mean", "sd"]]


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


def spearman_out(steps: pd.DataFrame, drops: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    t = A.spearman_table(steps, drops, n_boot=n_boot)
    t["rho [95 % CI]"] = [f"{_fmt(r)} [{_fmt(lo)}, {_fmt(hi)}]" for r, lo, hi in zip(t["rho"], t["ci_low"], t["ci_high"])]
    t["paper"] = [PAPER_SPEARMAN[m] for m in t["measure"]]
    return t


def _cell(t: pd.DataFrame, model, sampler, correction, col="mean"):
    r = t.loc[(t["model"] == model) & (t["sampler"] == sampler) & (t["correction"] == correction), col]
    return float(r.iloc[0]) if len(r) else math.nan


def findings_table(nf, acc, ess, rs, off, sp, models) -> pd.DataFrame:
    """F1–F13 of PAPER.md: the paper's value beside ours, per model (ours as text)."""
    rows = []

    def add(fid, what, paper, ours):
        rows.append({"finding": fid, "what": what, "paper": paper, "ours": ours})

    per = lambda f: "; ".join(f"{m}: {f(m)}" for m in models)  # noqa: E731
    mult = lambda s, c: per(lambda m: _fmt(_cell(nf, m, s, c)) + "x")  # noqa: E731
    add("F1", "IS fails once lag ESS < 1/2", "criterion",
        per(lambda m: "; ".join(f"{r['sampler']}: ESS {r['ESS < 1/2 at step (per seed)']} / leaves {r['is leaves the floor (per seed)']}"
                                for _, r in ess.loc[ess["model"] == m].iterrows()) or "n/a"))
    add("F2", "stale: ESS crossing vs Gaussian prediction", "11 vs 14",
        per(lambda m: "; ".join(f"{r['ESS < 1/2 at step (per seed)']} vs {r['Gaussian predicts (per seed)']}"
                                for _, r in ess.loc[(ess["model"] == m) & (ess["sampler"] == "stale")].iterrows()) or "n/a"))
    add("F3", "fp8: PG multiple (corrections near the floor)", "PG 13x",
        per(lambda m: f"pg {_fmt(_cell(nf, m, 'fp8', 'pg'))}x, center {_fmt(_cell(nf, m, 'fp8', 'center'))}x, dlc {_fmt(_cell(nf, m, 'fp8', 'dlc'))}x"))
    add("F4", "fp8: center's final test accuracy vs on-policy", "46.5 %",
        per(lambda m: f"center {_fmt(_cell(acc, m, 'fp8', 'center'))} vs bf16/pg {_fmt(_cell(acc, m, 'bf16', 'pg'))}"))
    add("F5", "stale: center multiple, accuracy", "32x, 12.2 %",
        per(lambda m: f"{_fmt(_cell(nf, m, 'stale', 'center'))}x, {_fmt(_cell(acc, m, 'stale', 'center'))}"))
    add("F6", "stale: is_center multiple, accuracy", "2.1x, 32.0 %",
        per(lambda m: f"{_fmt(_cell(nf, m, 'stale', 'is_center'))}x, {_fmt(_cell(acc, m, 'stale', 'is_center'))}"))
    add("F7", "stale: PPO multiple", "699x", mult("stale", "ppo"))
    add("F8", "stale: DLC multiple", "<=2x (0.6B 1.9x)", mult("stale", "dlc"))
    add("F9", "stale: DLC resync steps", "20, 35, 36",
        per(lambda m: " | ".join(rs.loc[(rs["model"] == m) & (rs["sampler"] == "stale") & (rs["correction"] == "dlc"), "resync steps"]) or "n/a"))
    add("F10", "stale: IS vs IS + resync multiple", "115x -> 2.6x",
        per(lambda m: f"{_fmt(_cell(nf, m, 'stale', 'is'))}x -> {_fmt(_cell(nf, m, 'stale', 'is_resync'))}x"))
    pooled = off.loc[off["model"] == "pooled"].set_index("resync")
    get = lambda r, c: _fmt(float(pooled.loc[r, c])) if r in pooled.index else "n/a"  # noqa: E731
    add("F11", "off-support share: at collapse / before (no resync); with resync", "90 %, <=14 %, <=11 %",
        f"{get('without', 'off_support_at_collapse_mean')}, {get('without', 'off_support_before_max')}, {get('with', 'off_support_before_max')}")
    add("F12", "kl_sampler at collapse vs healthy runs' range", "within range",
        f"{get('without', 'kl_sampler_at_collapse_mean')} vs [{get('without', 'kl_sampler_healthy_min')}, {get('without', 'kl_sampler_healthy_max')}]")
    spp = sp.loc[sp["model"] == "pooled"].set_index("measure")
    add("F13", "Spearman with accuracy drop: off-support, deviation", "0.80 vs 0.74",
        f"{spp.loc['off_support', 'rho [95 % CI]']} vs {spp.loc['noise_floor_multiple', 'rho [95 % CI]']}" if len(spp) else "n/a")
    return pd.DataFrame(rows)


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


def write_table(df: pd.DataFrame, out: Path, name: str, caption: str) -> None:
    shown = df.drop(columns=[c for c in ("mean", "sd") if c in df.columns])
    atomic_write_text(out / f"{name}.csv", df.to_csv(index=False))
    atomic_write_text(out / f"{name}.md", to_md(shown, caption))
    atomic_write_text(out / f"{name}.tex", to_tex(shown, caption))


CAPTIONS = {
    "noise_floor": "Deviation from on-policy training in multiples of the noise floor, M = sum dev / sum floor per run (mean ± sd over seeds).",
    "accuracy": "Final greedy test accuracy (mean ± sd over seeds).",
    "ess_crossing": "First step with lag ESS < 1/2 (empirical, on the fresh batch), the step the Gaussian prediction exp(-Var lag) crosses, and the step `is` leaves the floor (3-step moving average of dev/floor > 2).",
    "resync": "Steps at which each run with resync resynchronized its sampler.",
    "off_support": "Off-support share (tokens of the trainer's own responses with probability < 1e-3 under the initial policy) before / at collapse points (accuracy drop >= half the bf16/pg reference), beside the sampler-side KL.",
    "spearman": "Spearman correlation with the accuracy drop over (run, eval step) pairs of non-reference runs; 95 % bootstrap intervals resample runs.",
    "findings": "Findings F1-F13 of the paper: the paper's value and this run's.",
}


def write_all(steps: pd.DataFrame, runs: pd.DataFrame, out: Path, n_boot: int = 1000, replicates: list[list[int]] | None = None) -> dict[str, pd.DataFrame]:
    out = Path(out)
    pr = A.per_run(steps, runs)
    drops = A.accuracy_drops(steps)
    t = {
        "noise_floor": noise_floor_table(pr),
        "accuracy": accuracy_table(pr),
        "ess_crossing": ess_crossing_table(pr),
        "resync": resync_table(pr),
        "off_support": off_support_table(drops),
        "spearman": spearman_out(steps, drops, n_boot),
    }
    t["findings"] = findings_table(t["noise_floor"], t["accuracy"], t["ess_crossing"], t["resync"], t["off_support"], t["spearman"],
                                   sorted(steps["model"].unique()))
    for name, df in t.items():
        write_table(df, out, name, CAPTIONS[name])
    return t
