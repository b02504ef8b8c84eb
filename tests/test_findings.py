"""The findings' rules on hand-made studies whose answers are known: three verdicts (seen,
contradicted, undecided, with the seeds that would decide), agreement needs the whole interval inside
a stated margin, F7 reads the paper's PPO (several SGD steps per batch), a diverged run contradicts
F8, and a finding seen on one kind of CPU only reads "seen on one machine"."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from dlcrepro import findings as F
from dlcrepro import intervals as I

NAN = math.nan


def study(cells: dict[tuple[str, str], dict], seeds=(0, 1, 2)) -> tuple[pd.DataFrame, pd.DataFrame]:
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


def rule(steps, runs, fn) -> F.Result:
    return fn(F.replicate_context(steps, runs, n_boot=400))


def test_f4_holds_only_when_the_whole_paired_interval_is_inside_the_margin():
    ref = [0.40, 0.50, 0.45]
    # centring within 1-2 points of the reference in every seed: interval well inside ±10 points
    close = rule(*study({("bf16", "pg"): {"final": ref}, ("fp8", "center"): {"final": [0.41, 0.49, 0.46]}}),
                 F.f4_fp8_center_matches_on_policy)
    assert close.verdict == F.SEEN and -10 < close.low <= close.value <= close.high < 10
    # differences -20, +5, +10 points: the interval holds 0 but reaches past -10: these seeds cannot tell
    wide = rule(*study({("bf16", "pg"): {"final": ref}, ("fp8", "center"): {"final": [0.20, 0.55, 0.55]}}),
                F.f4_fp8_center_matches_on_policy)
    assert wide.low < -10 < 0 < wide.high and wide.verdict == F.UNDECIDED
    assert "margin ±10" in wide.text
    # centring 30-32 points below the reference in every seed: the whole interval outside the margin
    far = rule(*study({("bf16", "pg"): {"final": ref}, ("fp8", "center"): {"final": [0.10, 0.19, 0.14]}}),
               F.f4_fp8_center_matches_on_policy)
    assert far.high < -10 and far.verdict == F.CONTRADICTED


def test_f7_reads_the_paper_ppo_with_several_sgd_steps_not_ppo_which_is_pg():
    assert F.PAPER_PPO == "ppo_multi"
    from dlcrepro.config import TrainConfig
    from dlcrepro.grid import computed_as
    from dlcrepro.registry import updates_per_batch

    assert computed_as("stale", "ppo", TrainConfig())[0] == "pg"  # one SGD step: pg's run, a copy
    assert computed_as("stale", F.PAPER_PPO, TrainConfig())[0] == F.PAPER_PPO
    assert updates_per_batch(F.PAPER_PPO, TrainConfig()) > 1
    f7 = next(f for f in F.FINDINGS if f.id == "F7")
    only_ppo = rule(*study({("stale", "ppo"): {"dev": [50.0] * 3}}), f7.rule)
    assert only_ppo == F.NOT_IN_GRID  # pg's copy under the name ppo is not the paper's PPO
    multi = rule(*study({("stale", "ppo_multi"): {"dev": [50.0] * 3, "diverged": [3, NAN, 4]}}), f7.rule)
    assert multi.verdict == F.SEEN and multi.value == pytest.approx(50.0)
    assert "2 of 3 runs diverged (steps 3, 4)" in multi.text


def test_f7_sets_the_on_policy_runs_of_the_same_step_size_beside_the_lagged_ones():
    """The control that tells the lag from the step size: the same correction's runs that collapsed
    (half the reference's accuracy lost) or diverged, on-policy (bf16, fp8) and lagged (stale,
    fp8_stale), counted over every run of each."""
    f7 = next(f for f in F.FINDINGS if f.id == "F7")
    cells = {("bf16", "pg"): {"final": [0.4] * 3},
             ("bf16", "ppo_multi"): {"final": [0.0, 0.4, 0.35]},  # seed 0 collapses without diverging
             ("fp8", "ppo_multi"): {},
             ("stale", "ppo_multi"): {"dev": [50.0] * 3, "diverged": [6, 6, 9]},
             ("fp8_stale", "ppo_multi"): {"diverged": [5, 7, NAN]}}
    got = rule(*study(cells), f7.rule)
    assert got.text.endswith("; at its step size, runs collapsed or diverged: on-policy 1 of 6, lagged 5 of 6"), got.text
    # without an on-policy cell of that correction there is no control to print
    alone = rule(*study({("stale", "ppo_multi"): {"dev": [50.0] * 3}}), f7.rule)
    assert "at its step size" not in alone.text and alone.verdict == F.SEEN


def test_f8_needs_the_whole_interval_at_or_below_two_and_no_diverged_run():
    within = rule(*study({("stale", "dlc"): {"dev": [1.2, 1.5, 1.1]}}), F.f8_dlc_within_two)
    assert within.verdict == F.SEEN and within.high <= 2
    # mean 1.9, one run at 3: the interval reaches past 2 and below it: undecided, with the seeds that
    # would decide it at this spread
    straddles = rule(*study({("stale", "dlc"): {"dev": [1.2, 1.5, 3.0]}}), F.f8_dlc_within_two)
    assert straddles.low < 2 < straddles.high and straddles.verdict == F.UNDECIDED
    sd = np.std([1.2, 1.5, 3.0], ddof=1)
    assert straddles.seeds_needed == I.seeds_needed(1.9, sd, [2.0]) and straddles.seeds_needed > 100
    above = rule(*study({("stale", "dlc"): {"dev": [3.2, 3.5, 3.0]}}), F.f8_dlc_within_two)
    assert above.low > 2 and above.verdict == F.CONTRADICTED
    # the same low M, but one run diverged at step 3: it left the floor for good, whatever its M before
    truncated = rule(*study({("stale", "dlc"): {"dev": [1.2, 1.5, 1.1], "diverged": [NAN, 3, NAN]}}), F.f8_dlc_within_two)
    assert truncated.high <= 2 and truncated.verdict == F.CONTRADICTED
    assert "1 of 3 runs diverged (step 3)" in truncated.text


def test_f8_prints_an_end_near_the_margin_with_the_digits_that_show_its_side():
    """The issue's F8: an upper end of 2.005 printed "2" beside ✗; now it prints 2.005."""
    assert F._ci({"mean": 1.2, "ci_low": 0.719, "ci_high": 2.005}, margins=[2.0]) == "1.2x [0.719, 2.005]"


def test_orderings_are_paired_differences_by_seed():
    """F6: is_center below center. Seeds differ a lot between each other but within a seed is_center
    is always 1 below center: the paired difference is exactly −1, seen, where two overlapping
    intervals of the cells alone would not tell."""
    steps, runs = study({("stale", "center"): {"dev": [3.0, 6.0, 12.0]}, ("stale", "is_center"): {"dev": [2.0, 5.0, 11.0]}})
    f6 = rule(steps, runs, F.f6_is_center_below_center)
    assert f6.verdict == F.SEEN and f6.value == pytest.approx(6.0)
    assert "is_center − center -1 [-1, -1]" in f6.text


def test_a_rule_over_every_run_is_undecided_when_the_runs_disagree():
    assert F.every_run([True, True, True]) == F.SEEN
    assert F.every_run([False, False]) == F.CONTRADICTED
    assert F.every_run([True, False, True]) == F.UNDECIDED
    assert F.every_run([]) == F.CANNOT_TELL


def test_the_findings_table_carries_each_replicates_headline_number_the_machine_and_the_rules_commit():
    steps, runs = study({("bf16", "pg"): {"final": [0.40, 0.50, 0.45, 0.45]}, ("fp8", "pg"): {"dev": [3.0] * 4},
                         ("fp8", "center"): {"dev": [1.0] * 4, "final": [0.41, 0.49, 0.46, 0.45]}}, seeds=(0, 1, 2, 3))
    t = F.findings_table(steps, runs, [[0, 1], [2, 3]], n_boot=100, machine="x86-64 AVX2").set_index("finding")
    assert t.loc["F3", "seeds 0,1 value"] == pytest.approx(3.0) and t.loc["F3", "paper value"] == 13.0
    assert t.loc["F3", "unit"] == "x floor" and t.loc["F3", "seen"] == "seen" and t.loc["F3", "seeds to decide"] == "—"
    assert (t["machine"] == "x86-64 AVX2").all()
    assert (t["rules"] == (F.RULES_COMMIT or "uncommitted")).all()
    assert np.isnan(t.loc["F5", "seeds 0,1 value"])  # not in this grid: no number
    # a paper value the paper does not state is marked as derived, and how; one it states is not
    assert t.loc["F13", "paper value derived"] == "derived: 0.80 − 0.74" and t.loc["F3", "paper value derived"] == ""
    assert "46.5" not in t.loc["R", "paper"].split("(")[0]  # F4's number, not the on-policy reference's


def test_cpu_kind_names_the_instruction_sets_kernels_are_chosen_by():
    assert F.cpu_kind("flags\t\t: fpu sse avx2 fma\n") == "x86-64 AVX2"
    assert F.cpu_kind("flags\t\t: fpu avx2 avx512f avx512bw\n") == "x86-64 AVX-512"
    assert F.cpu_kind("flags\t\t: avx2 avx512f amx_tile amx_bf16\n") == "x86-64 AVX-512 + AMX"


def findings_of(machine: str, seen: dict[str, str], rules: str = "abc1234") -> pd.DataFrame:
    return pd.DataFrame({"finding": list(seen), "model": "tiny", "seen": list(seen.values()), "machine": machine, "rules": rules})


def test_a_finding_seen_on_one_cpu_kind_and_not_another_is_seen_on_one_machine():
    here = findings_of("x86-64 AVX2", {"R": "seen", "F1": "not seen", "F8": "seen", "F2": "not seen"})
    there = findings_of("x86-64 AVX-512", {"R": "seen", "F1": "seen", "F8": "not replicated", "F2": "not seen"})
    out = F.across_machines(here, [there]).set_index("finding")
    assert out.loc["R", "seen"] == "seen" and out.loc["F2", "seen"] == "not seen"
    assert out.loc["F1", "seen"] == F.SEEN_ON_ONE_MACHINE == out.loc["F8", "seen"]
    assert out.loc["F8", "other machines"] == "x86-64 AVX-512: not replicated (rules abc1234)"
    # a table made under other rules is compared where it states the same rule, word for word, else
    # named, never counted
    old = findings_of("x86-64 AVX-512", {"F1": "seen", "F2": "seen"}, rules="0000000")
    old["rule"] = ["every run ...", "older rule"]
    stale_rules = F.across_machines(here.assign(rule=["r", "every run ...", "f8", "newer rule"]), [old]).set_index("finding")
    assert stale_rules.loc["F1", "seen"] == F.SEEN_ON_ONE_MACHINE
    assert stale_rules.loc["F1", "other machines"] == "x86-64 AVX-512: seen (rules 0000000)"
    assert stale_rules.loc["F2", "seen"] == "not seen"
    assert stale_rules.loc["F2", "other machines"] == "x86-64 AVX-512: rules 0000000, another rule, not compared"
    # no other machine: this machine's verdicts, said so
    alone = F.across_machines(here, [])
    assert alone["seen"].tolist() == here["seen"].tolist() and (alone["other machines"] == "none compared").all()


def test_the_rules_commit_is_the_one_whose_message_says_so():
    """findings.RULES_COMMIT, once filled, names a commit of this history whose message starts
    "Rules for the rerun:" and which changed dlcrepro/findings.py."""
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
    assert "dlcrepro/findings.py" in files.split()


def test_one_command_rebuilds_findings_csv_from_the_findings_input_alone(tmp_path):
    """The tables job writes what the findings read (findings_steps.csv, findings_runs.csv) and
    computes findings.csv from it as written; `python -m dlcrepro findings --from DIR` on a folder
    holding only those two files (and another machine's input under other_machines/) rebuilds
    findings.csv and findings.md byte for byte."""
    import shutil

    from dlcrepro import cli, outputs
    from dlcrepro import tables as T

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
    assert written.loc["F8", "seen"] == F.SEEN_ON_ONE_MACHINE and "x86-64 AVX2: undecided" in written.loc["F8", "other machines"]

    repo = tmp_path / "clone"
    (repo / "other_machines").mkdir(parents=True)
    for name in outputs.FINDINGS_INPUT:
        shutil.copy(tables / name, repo / name)
    shutil.copytree(other, repo / "other_machines" / "avx2")
    assert cli.main(["findings", "--from", str(repo), "--n-boot", "100"]) == 0
    for name in ("findings.csv", "findings.md"):
        assert (repo / name).read_bytes() == (tables / name).read_bytes(), name
