"""The findings' rules on hand-made studies whose answers are known: one pooled verdict over every seed
(seen, contradicted, undecided, with the seeds that would decide it and towards which), multiples and
their ratios on the log scale with positive ends, agreement needs the whole interval inside a stated
margin, F7 reads the paper's PPO (several SGD steps per batch), a diverged run enters every M rule the
same way, and another machine's verdict is set beside this one's, never over it."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from dlcrepro.report import findings as F
from dlcrepro.report import intervals as I
from dlcrepro.report.sequential import DESIGN

NAN = math.nan
SIX = (0, 1, 2, 3, 4, 5)


def study(cells: dict[tuple[str, str], dict], seeds=SIX) -> tuple[pd.DataFrame, pd.DataFrame]:
    """4 steps per run, a probe at every step; `cells[(sampler, correction)]` gives per-seed lists:
    `final` accuracy, `dev` (the floor is 1, so M is the mean dev), `diverged` step (NaN: none)."""
    steps, runs = [], []
    for (sampler, correction), spec in cells.items():
        for i, k in enumerate(seeds):
            final = spec.get("final", [0.4] * len(seeds))[i]
            dev = spec.get("dev", [1.0] * len(seeds))[i]
            steps.append(pd.DataFrame(dict(model="m", sampler=sampler, correction=correction, seed=k, step=[1, 2, 3, 4],
                                           dev=[dev] * 4, floor=[1.0] * 4, dev_ratio=[dev] * 4, ess_lag=1.0, ess_lag_presync=NAN,
                                           ess_lag_gauss=1.0, test_accuracy=[NAN, 0.3, NAN, final], off_support=0.0,
                                           kl_sampler=0.0, resync=0, discrepancy_mean_abs=0.02,
                                           lag_mean_abs=[0.1, 0.2, 0.3, 0.4])))
            runs.append(dict(model="m", sampler=sampler, correction=correction, seed=k, final_test_accuracy=final,
                             initial_test_accuracy=0.25, resync_steps=json.dumps([]), computed_as="",
                             diverged_at_step=spec.get("diverged", [NAN] * len(seeds))[i]))
    return pd.concat(steps, ignore_index=True), pd.DataFrame(runs)


def rule(steps, runs, fn, level: float = DESIGN.level) -> F.Result:
    return fn(F.evidence(steps, runs, n_boot=400, level=level))


def test_f4_holds_only_when_the_whole_paired_interval_is_inside_the_margin():
    ref = [0.40, 0.50, 0.45, 0.42, 0.48, 0.44]
    # centring within 1-2 points of the reference in every seed: interval well inside ±10 points
    close = rule(*study({("bf16", "pg"): {"final": ref}, ("fp8", "center"): {"final": [0.41, 0.49, 0.46, 0.43, 0.47, 0.45]}}),
                 F.f4_fp8_center_matches_on_policy)
    assert close.verdict == F.SEEN and -10 < close.low <= close.value <= close.high < 10 and close.seeds == 6
    # differences -20, +5, +10, ... points: the interval holds 0 but reaches past -10: these seeds cannot tell
    wide = rule(*study({("bf16", "pg"): {"final": ref}, ("fp8", "center"): {"final": [0.20, 0.55, 0.55, 0.40, 0.50, 0.45]}}),
                F.f4_fp8_center_matches_on_policy)
    assert wide.low < -10 < 0 < wide.high and wide.verdict == F.UNDECIDED
    assert "margin ±10" in wide.text and wide.projection.towards == F.SEEN
    # centring 30-32 points below the reference in every seed: the whole interval outside the margin
    far = rule(*study({("bf16", "pg"): {"final": ref}, ("fp8", "center"): {"final": [0.10, 0.19, 0.14, 0.11, 0.17, 0.13]}}),
               F.f4_fp8_center_matches_on_policy)
    assert far.high < -10 and far.verdict == F.CONTRADICTED


def test_f7_reads_the_paper_ppo_with_several_sgd_steps_not_ppo_which_is_pg():
    assert F.PAPER_PPO == "ppo_multi"
    from dlcrepro.core.config import TrainConfig
    from dlcrepro.core.grid import computed_as
    from dlcrepro.core.registry import updates_per_batch

    assert computed_as("stale", "ppo", TrainConfig())[0] == "pg"  # one SGD step: pg's run, a copy
    assert computed_as("stale", F.PAPER_PPO, TrainConfig())[0] == F.PAPER_PPO
    assert updates_per_batch(F.PAPER_PPO, TrainConfig()) > 1
    f7 = next(f for f in F.FINDINGS if f.id == "F7")
    only_ppo = rule(*study({("stale", "ppo"): {"dev": [50.0] * 6}}), f7.rule)
    assert only_ppo == F.NOT_IN_GRID  # pg's copy under the name ppo is not the paper's PPO
    multi = rule(*study({("stale", "ppo_multi"): {"dev": [50.0] * 6, "diverged": [3, NAN, 4, NAN, NAN, NAN]}}), f7.rule)
    assert multi.verdict == F.SEEN and multi.value == pytest.approx(50.0)
    assert "2 of 6 runs diverged (steps 3, 4)" in multi.text


def test_f7_sets_the_on_policy_runs_of_the_same_step_size_beside_the_lagged_ones():
    """The control that tells the lag from the step size: the same correction's runs that collapsed
    (half the reference's accuracy lost) or diverged, on-policy (bf16, fp8) and lagged (stale,
    fp8_stale), counted over every run of each."""
    f7 = next(f for f in F.FINDINGS if f.id == "F7")
    three = (0, 1, 2)
    cells = {("bf16", "pg"): {"final": [0.4] * 3},
             ("bf16", "ppo_multi"): {"final": [0.0, 0.4, 0.35]},  # seed 0 collapses without diverging
             ("fp8", "ppo_multi"): {},
             ("stale", "ppo_multi"): {"dev": [50.0] * 3, "diverged": [6, 6, 9]},
             ("fp8_stale", "ppo_multi"): {"diverged": [5, 7, NAN]}}
    got = rule(*study(cells, three), f7.rule)
    assert got.text.endswith("; at its step size, runs collapsed or diverged: on-policy 1 of 6, lagged 5 of 6"), got.text
    # without an on-policy cell of that correction there is no control to print
    alone = rule(*study({("stale", "ppo_multi"): {"dev": [50.0] * 3}}, three), f7.rule)
    assert "at its step size" not in alone.text and alone.verdict == F.SEEN


def test_multiples_are_judged_on_the_log_scale_with_positive_ends():
    """The issue's F7: M over seeds spanning decades. The arithmetic interval reaches below 0; the
    one on log M is positive, centred on the geometric mean, and judged against log 2."""
    dev = [1e5, 30.0, 2.0, 4e3, 1.5, 600.0]
    f5 = rule(*study({("stale", "center"): {"dev": dev}}), F.FINDINGS[6].rule)
    assert I.t_interval(dev, DESIGN.level)[1] < 0  # what the arithmetic interval said
    assert 0 < f5.low < f5.value < f5.high
    assert f5.value == pytest.approx(math.exp(np.mean(np.log(dev))))
    logs = np.log(dev)
    half = I.t_quantile(6, DESIGN.level) * np.std(logs, ddof=1) / math.sqrt(6)
    assert math.log(f5.low) == pytest.approx(logs.mean() - half) and math.log(f5.high) == pytest.approx(logs.mean() + half)


def test_f8_needs_the_whole_interval_at_or_below_two_and_a_diverged_run_keeps_it_from_being_seen():
    within = rule(*study({("stale", "dlc"): {"dev": [1.2, 1.5, 1.1, 1.3, 1.2, 1.4]}}), F.f8_dlc_within_two)
    assert within.verdict == F.SEEN and within.high <= 2
    # geometric mean near 1.8, one run at 3: the interval straddles 2: undecided, with the seeds that
    # would decide it at this spread, towards seen
    dev = [1.2, 1.5, 3.0, 1.9, 1.6, 2.1]
    straddles = rule(*study({("stale", "dlc"): {"dev": dev}}), F.f8_dlc_within_two)
    assert straddles.low < 2 < straddles.high and straddles.verdict == F.UNDECIDED
    logs = np.log(dev)
    expected = I.projection(logs.mean(), np.std(logs, ddof=1), 6, upper=math.log(2), level=DESIGN.level)
    assert straddles.projection == expected and straddles.projection.towards == F.SEEN
    assert straddles.seeds_needed == expected.seeds
    above = rule(*study({("stale", "dlc"): {"dev": [3.2, 3.5, 3.0, 3.3, 3.1, 3.4]}}), F.f8_dlc_within_two)
    assert above.low > 2 and above.verdict == F.CONTRADICTED
    # the same low M, but one run diverged at step 3: its M is known only from below: not seen
    truncated = rule(*study({("stale", "dlc"): {"dev": [1.2, 1.5, 1.1, 1.3, 1.2, 1.4],
                                                "diverged": [NAN, 3, NAN, NAN, NAN, NAN]}}), F.f8_dlc_within_two)
    assert truncated.high <= 2 and truncated.verdict == F.UNDECIDED
    assert "1 of 6 runs diverged (step 3)" in truncated.text


def test_f8_prints_an_end_near_the_margin_with_the_digits_that_show_its_side():
    """The issue's F8: an upper end of 2.005 printed "2" beside ✗; now it prints 2.005."""
    assert F.Estimate(1.2, 0.719, 2.005, 0.3, 6, log=True).text("x", [2.0]) == "1.2x [0.719, 2.005]"


def test_orderings_are_ratios_of_multiples_paired_by_seed():
    """F6: is_center below center. Seeds differ a lot between each other but within a seed is_center
    is always half of center: the paired ratio is exactly 0.5, seen, where two overlapping intervals
    of the cells alone would not tell."""
    center = [3.0, 6.0, 12.0, 5.0, 8.0, 20.0]
    steps, runs = study({("stale", "center"): {"dev": center}, ("stale", "is_center"): {"dev": [c / 2 for c in center]}})
    f6 = rule(steps, runs, F.f6_is_center_below_center)
    assert f6.verdict == F.SEEN and f6.value == pytest.approx(math.exp(np.mean(np.log(center))) / 2)
    assert "is_center / center 0.5x [0.5, 0.5]" in f6.text
    # a diverged is_center run: its M is known only from below, which could make the ratio look small
    steps, runs = study({("stale", "center"): {"dev": center},
                         ("stale", "is_center"): {"dev": [c / 2 for c in center], "diverged": [2, NAN, NAN, NAN, NAN, NAN]}})
    assert rule(steps, runs, F.f6_is_center_below_center).verdict == F.UNDECIDED


def test_one_verdict_pools_every_seed_and_the_groups_only_show_beside_it():
    """Two groups of three that each straddle the bound, pooled into six that clear it: the verdict
    is the pooled one; the groups' marks stand beside it."""
    dev = [1.3, 1.6, 1.1, 1.2, 1.5, 1.4]
    steps, runs = study({("stale", "dlc"): {"dev": dev}})
    t = F.findings_table(steps, runs, [[0, 1, 2], [3, 4, 5]], n_boot=100, machine="x86-64 AVX2").set_index("finding")
    assert t.loc["F8", "verdict"] == F.SEEN and t.loc["F8", "seeds"] == 6
    assert t.loc["F8", "seeds 0,1,2"].startswith("?") and t.loc["F8", "seeds 3,4,5"].startswith("?")
    assert t.loc["F8", "level"] == DESIGN.level


def test_a_rule_seeds_cannot_decide_says_why():
    res = F.Result("x", F.UNDECIDED, decidable=False, why_not="a largest value")
    assert res.seeds_to_decide() == "not decidable by seeds: a largest value"
    past = F.Result("x", F.UNDECIDED, projection=I.Projection(F.SEEN, 58, 25, 300))
    assert past.seeds_to_decide().endswith(f"past the cap of {DESIGN.cap} seeds")
    assert F.Result("x", F.SEEN).seeds_to_decide() == "—"


def test_the_findings_table_carries_the_headline_number_the_machine_and_the_rules_commit():
    steps, runs = study({("bf16", "pg"): {"final": [0.40, 0.50, 0.45, 0.45]}, ("fp8", "pg"): {"dev": [3.0] * 4},
                         ("fp8", "center"): {"dev": [1.0] * 4, "final": [0.41, 0.49, 0.46, 0.45]}}, seeds=(0, 1, 2, 3))
    t = F.findings_table(steps, runs, [[0, 1], [2, 3]], n_boot=100, machine="x86-64 AVX2").set_index("finding")
    assert t.loc["F3", "value"] == pytest.approx(3.0) and t.loc["F3", "paper value"] == 13.0
    assert t.loc["F3", "seeds 0,1 value"] == pytest.approx(3.0)
    assert t.loc["F3", "unit"] == "x floor" and t.loc["F3", "verdict"] == "seen" and t.loc["F3", "seeds to decide"] == "—"
    assert (t["machine"] == "x86-64 AVX2").all()
    assert (t["rules"] == (F.RULES_COMMIT or "uncommitted")).all()
    assert np.isnan(t.loc["F5", "value"])  # not in this grid: no number
    # a paper value the paper does not state is marked as derived, and how; one it states is not
    assert t.loc["F13", "paper value derived"] == "derived: 0.80 − 0.74" and t.loc["F3", "paper value derived"] == ""
    assert "46.5" not in t.loc["R", "paper"].split("(")[0]  # F4's number, not the on-policy reference's


def test_cpu_kind_names_the_instruction_sets_kernels_are_chosen_by():
    assert F.cpu_kind("flags\t\t: fpu sse avx2 fma\n") == "x86-64 AVX2"
    assert F.cpu_kind("flags\t\t: fpu avx2 avx512f avx512bw\n") == "x86-64 AVX-512"
    assert F.cpu_kind("flags\t\t: avx2 avx512f amx_tile amx_bf16\n") == "x86-64 AVX-512 + AMX"


def findings_of(machine: str, verdicts: dict[str, str], rules: str = "abc1234", column: str = "verdict") -> pd.DataFrame:
    return pd.DataFrame({"finding": list(verdicts), "model": "tiny", column: list(verdicts.values()), "machine": machine,
                         "rules": rules, "seeds": 6})


def test_another_machines_verdict_stands_beside_this_ones_never_over_it():
    here = findings_of("x86-64 AVX2", {"R": "seen", "F1": "contradicted", "F8": "seen", "F2": "undecided"})
    there = findings_of("x86-64 AVX-512", {"R": "seen", "F1": "seen", "F8": "undecided", "F2": "undecided"})
    out = F.across_machines(here, [there]).set_index("finding")
    assert out["verdict"].tolist() == here["verdict"].tolist()  # this machine's verdicts, as they were
    assert out.loc["F1", "verdict"] == "contradicted"
    assert out.loc["F1", "other machines"] == "x86-64 AVX-512: seen, 6 seeds (same rules)"
    # a table made under other rules is compared where it states the same rule, word for word, else
    # named, never compared; an older table's `seen` column is read as its verdict
    old = findings_of("x86-64 AVX-512", {"F1": "seen", "F2": "seen"}, rules="0000000", column="seen").drop(columns="seeds")
    old["rule"] = ["every run ...", "older rule"]
    stale_rules = F.across_machines(here.assign(rule=["r", "every run ...", "f8", "newer rule"]), [old]).set_index("finding")
    assert stale_rules.loc["F1", "other machines"] == "x86-64 AVX-512: seen (rules 0000000, the same rule)"
    assert stale_rules.loc["F2", "other machines"] == "x86-64 AVX-512: other rules (0000000), not compared"
    # no other machine: this machine's verdicts, said so
    alone = F.across_machines(here, [])
    assert alone["verdict"].tolist() == here["verdict"].tolist() and (alone["other machines"] == "none compared").all()


def test_the_rules_commit_is_the_one_whose_message_says_so():
    """findings.RULES_COMMIT, once filled, names a commit of this history whose message starts
    "Rules for the rerun:" and which changed the findings' module (dlcrepro/findings.py before the
    layers' folders, dlcrepro/report/findings.py since)."""
    import shutil
    import subprocess

    from conftest import ROOT

    if not F.RULES_COMMIT:
        pytest.skip("RULES_COMMIT not filled yet (the commit after the rules fills it)")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git history here")
    show = subprocess.run(["git", "show", "--no-patch", "--format=%s", F.RULES_COMMIT], cwd=ROOT, capture_output=True, text=True)
    if show.returncode != 0:
        pytest.skip(f"commit {F.RULES_COMMIT} not in this clone (shallow?)")
    assert show.stdout.startswith("Rules for the rerun:")
    files = subprocess.run(["git", "show", "--name-only", "--format=", F.RULES_COMMIT], cwd=ROOT, capture_output=True,
                           text=True).stdout
    assert {"dlcrepro/findings.py", "dlcrepro/report/findings.py"} & set(files.split())


def test_one_command_rebuilds_findings_csv_from_the_findings_input_alone(tmp_path):
    """The tables job writes what the findings read (findings_steps.csv, findings_runs.csv) and
    computes findings.csv from it as written; `python -m dlcrepro findings --from DIR` on a folder
    holding only those two files (and another machine's input under other_machines/) rebuilds
    findings.csv and findings.md byte for byte."""
    import shutil

    from dlcrepro.run import cli
    from dlcrepro.report import outputs
    from dlcrepro.report import tables as T

    seeds, reps = (0, 1, 2, 3, 4, 5), [[0, 1, 2], [3, 4, 5]]
    cells = {("bf16", "pg"): {"final": [0.40, 0.50, 0.45, 0.47, 0.44, 0.52]},
             ("fp8", "pg"): {"dev": [3.0, 2.5, 3.5, 2.9, 3.1, 2.7]},
             ("fp8", "center"): {"dev": [1.0, 1.2, 0.9, 1.1, 1.0, 1.3], "final": [0.41, 0.49, 0.46, 0.46, 0.45, 0.50]},
             ("stale", "is"): {"dev": [9.0, 30.0, 12.0, 8.0, 11.0, 20.0], "final": [0.1, 0.2, 0.0, 0.1, 0.0, 0.1]},
             ("stale", "dlc"): {"dev": [1.2, 1.3, 1.1, 1.1, 1.2, 1.3]}}
    steps, runs = study(cells, seeds)
    tables = tmp_path / "tables"
    other = tables / "other_machines" / "avx2"  # the same grid on another CPU kind: F8 straddles 2 there
    other.mkdir(parents=True)
    elsewhere = study({**cells, ("stale", "dlc"): {"dev": [1.2, 3.5, 1.1, 1.1, 1.2, 1.3]}}, seeds)
    T.write_findings_input(other, *F.findings_input(*elsewhere, reps, "x86-64 AVX2"))
    others = T.other_machine_findings(outputs.other_machine_files(tables), n_boot=100)
    T.write_all(steps, runs, tables, n_boot=100, replicates=reps, other_machines=others, machine="x86-64 AVX-512")
    written = T.read_findings_table(tables / "findings.csv").set_index("finding")
    assert (written["rules"] == (F.RULES_COMMIT or "uncommitted")).all()  # a commit that looks like a number reads back as text
    assert written.loc["F8", "verdict"] == F.SEEN and "x86-64 AVX2: undecided" in written.loc["F8", "other machines"]

    repo = tmp_path / "clone"
    (repo / "other_machines").mkdir(parents=True)
    for name in outputs.FINDINGS_INPUT:
        shutil.copy(tables / name, repo / name)
    shutil.copytree(other, repo / "other_machines" / "avx2")
    assert cli.main(["findings", "--from", str(repo), "--n-boot", "100"]) == 0
    for name in ("findings.csv", "findings.md"):
        assert (repo / name).read_bytes() == (tables / name).read_bytes(), name


def test_r_reads_the_interval_of_the_rise_per_seed_against_ten_points():
    learns = rule(*study({("bf16", "pg"): {"final": [0.55, 0.60, 0.58, 0.57, 0.60, 0.59]}}), F.reference_learns)
    assert learns.verdict == F.SEEN and learns.low > 10 and learns.seeds == 6
    # a rise of 5 points in every seed: the whole interval below 10
    flat = rule(*study({("bf16", "pg"): {"final": [0.30, 0.31, 0.29, 0.30, 0.31, 0.30]}}), F.reference_learns)
    assert flat.verdict == F.CONTRADICTED and flat.high < 10


def test_f9_reads_the_resyncs_per_run_against_once():
    steps, runs = study({("stale", "dlc"): {}})
    runs["resync_steps"] = [json.dumps(x) for x in ([5, 9], [7, 8], [3, 8, 12], [6, 10], [9, 11], [4, 11, 15])]
    resyncs = rule(steps, runs, F.f9_dlc_resyncs)
    assert resyncs.value == pytest.approx(14 / 6) and resyncs.verdict == F.SEEN and resyncs.low >= 1
    # 2, 1, 3, 2, 1, 2 resyncs: every run resyncs, but six seeds at the design's level reach below once
    runs["resync_steps"] = [json.dumps(x) for x in ([5, 9], [7], [3, 8, 12], [6, 10], [9], [4, 11])]
    assert rule(steps, runs, F.f9_dlc_resyncs).verdict == F.UNDECIDED
    runs["resync_steps"] = json.dumps([])
    assert rule(steps, runs, F.f9_dlc_resyncs).verdict == F.CONTRADICTED  # no run resyncs: [0, 0]


def test_f12_says_seeds_cannot_decide_it():
    f12 = next(f for f in F.FINDINGS if f.id == "F12")
    res = rule(*study({("bf16", "pg"): {"final": [0.5] * 6}, ("stale", "is"): {"final": [0.0] * 6}}), f12.rule)
    assert res.verdict in (F.SEEN, F.CONTRADICTED) and res.decidable is False and res.why_not
