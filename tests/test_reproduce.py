"""Whether a run reproduced the committed study (dlcrepro/report/reproduce.py), and publishing a run as the
committed study (dlcrepro/report/publish.py): small exact cases first, then the committed inputs themselves
(the AMX study and the AVX-512 one under paper_tables/other_machines/)."""

import shutil

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT
from dlcrepro.report import outputs
from dlcrepro.report import reproduce as R
from dlcrepro.report.publish import publish, published_files

COMMITTED = ROOT / "paper_tables"
EPYC = COMMITTED / "other_machines" / "avx512-epyc-3bea749"  # the committed study is the AMX Xeon's


def study(where="here", machine="x86-64 AVX-512", seeds=(0, 1), dev=1.0) -> R.Study:
    """Two cells of two steps: bf16/pg per seed, every dev `dev`."""
    runs = pd.DataFrame([{"model": "tiny", "sampler": "bf16", "correction": "pg", "seed": s, "final_test_accuracy": 0.5,
                          "resync_steps": "[]", "computed_as": np.nan, "machine": machine, "replicates": "0,1"} for s in seeds])
    steps = pd.DataFrame([{"model": "tiny", "sampler": "bf16", "correction": "pg", "seed": s, "step": k, "dev": dev,
                           "floor": np.nan} for s in seeds for k in (1, 2)])
    return R.Study(where, steps, runs)


def test_two_equal_inputs_are_every_number_equal_nan_included():
    cells = R.cell_differences(study(), study("there"))
    assert list(cells["status"]) == ["equal", "equal"] and list(cells["columns"]) == ["", ""]


def test_one_changed_number_names_its_cell_its_column_and_its_size():
    there = study("there")
    there.steps.loc[(there.steps["seed"] == 1) & (there.steps["step"] == 2), "dev"] = 1.5
    cells = R.cell_differences(study(), there).set_index("seed")
    assert cells.loc[0, "status"] == "equal"
    assert cells.loc[1, "status"] == "differs" and cells.loc[1, "columns"] == "findings_steps.csv: dev"
    assert cells.loc[1, "largest difference"] == 0.5


def test_a_missing_step_and_a_changed_text_differ_without_a_size():
    there = study("there")
    there.runs.loc[0, "resync_steps"] = "[3]"
    there = R.Study("there", there.steps.iloc[1:], there.runs)
    cell = R.cell_differences(study(), there).set_index("seed").loc[0]
    assert cell["columns"] == "findings_runs.csv: resync_steps, findings_steps.csv: rows" and np.isnan(cell["largest difference"])


def test_where_each_side_ran_is_not_a_number_of_the_cell():
    cells = R.cell_differences(study(machine="x86-64 AVX2"), study("there"))
    assert set(cells["status"]) == {"equal"}


def test_a_cell_the_committed_study_lacks_is_named_not_compared():
    r = R.compare(study(seeds=(0, 1, 2)), [study("there", seeds=(0, 1))])
    assert r.headline == "2 cells, every number equal to the committed study"
    assert list(r.cells["status"]) == ["equal", "equal", R.ONLY_HERE]
    assert "Compared over the 2 cells both hold; 1 of this run's are not in the committed study, 0 of" in r.notes[1]


def test_the_committed_input_of_this_cpu_kind_is_picked_else_the_main_one():
    main, amx = study("main"), study("amx", machine="x86-64 AVX-512 + AMX")
    assert R.pick([main, amx], "x86-64 AVX-512 + AMX") == (amx, True)
    assert R.pick([main, amx], "x86-64 AVX2") == (main, False)
    assert R.committed_inputs(COMMITTED) == [COMMITTED, EPYC]  # the AVX2 machine's file is a findings table: no cells


def test_the_main_commands_seeds_against_the_committed_study_on_its_cpu_kind_are_every_number_equal():
    """The committed study's seeds 0-2 as the main command writes them (the same cells, made on the
    committed study's CPU kind): every number equal, the six-seed study named, no verdicts needed."""
    main = R.read_study(COMMITTED)
    run = R.restricted(main, main.runs[main.runs["seed"] <= 2])
    r = R.compare(run, [main, R.read_study(EPYC)])
    assert r.headline == "84 cells, every number equal to the committed study" and r.verdicts is None
    assert f"`{COMMITTED}`, seeds 0,1,2,3,4,5," in r.notes[0]
    assert "made on x86-64 AVX-512 + AMX (the same kind of CPU)" in r.notes[0]
    extra = len(main.runs) - 84  # seeds 3-5 and the decide run's seeds past 5
    assert f"{extra} of the committed study's are not in this run" in r.notes[1]


def test_on_another_cpu_kind_each_verdict_stands_beside_the_committed_one():
    """The AVX-512 study's seeds 0-2 against the AMX one (no committed input of the EPYC's kind
    offered): the kinds named, the cells that differ, and the fifteen findings' verdicts side by side,
    each computed over the cells both hold."""
    epyc = R.read_study(EPYC)
    run = R.restricted(epyc, epyc.runs[epyc.runs["seed"] <= 2])
    r = R.compare(run, [R.read_study(COMMITTED)], n_boot=200)
    differ = int((r.cells["status"] == "differs").sum())
    assert differ > 0 and f"84 cells, {differ} of them differ from the committed study" in r.headline
    assert "(this run on x86-64 AVX-512, the committed study on x86-64 AVX-512 + AMX)" in r.headline
    assert len(r.verdicts) == 15 and r.verdicts["verdict"].notna().all() and r.verdicts["verdict committed"].notna().all()
    assert f"{int(r.verdicts['same'].sum())} of 15 verdicts the same" in r.headline
    text = R.markdown(r)
    assert "## Verdicts, over the cells both hold" in text and text.count("| differs |") == differ


def test_the_report_says_when_there_is_nothing_to_compare(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in outputs.FINDINGS_INPUT:
        shutil.copy(EPYC / name, run / name)
    r = R.write_report(run, "", tmp_path / "reproduce.md", tmp_path / "figures")
    assert r.headline.startswith("not compared: this config names no committed study (config key `committed_tables_dir`")
    r = R.write_report(run, tmp_path / "empty", tmp_path / "reproduce.md", tmp_path / "figures")
    assert "holds no findings input" in r.headline and r.headline in (tmp_path / "reproduce.md").read_text()
    assert (tmp_path / "figures" / "reproduce.png").stat().st_size > 0


def fake_run(tmp_path):
    """A finished run's tables and figures: every file publish copies, each holding its own name."""
    tables, figures = tmp_path / "run" / "paper_tables", tmp_path / "run" / "figures"
    for f in published_files(tables, figures):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f.name)
    return tables, figures


def test_publish_copies_every_table_findings_input_and_figure_and_nothing_else(tmp_path):
    tables, figures = fake_run(tmp_path)
    (tables / outputs.REPRODUCTION_REPORT).write_text("the run's own")
    written = publish(tables, figures, tmp_path / "committed" / "tables", tmp_path / "committed" / "figures")
    assert sorted(p.name for p in written) == sorted(f.name for f in published_files(tables, figures))
    assert all(p.read_text() == p.name for p in written)
    assert "findings_steps.csv" in {p.name for p in written} and "findings.png" in {p.name for p in written}
    assert not (tmp_path / "committed" / "tables" / outputs.REPRODUCTION_REPORT).exists()


def test_publish_refuses_an_unfinished_run_or_no_destination_before_writing(tmp_path):
    tables, figures = fake_run(tmp_path)
    (figures / "ess.png").unlink()
    with pytest.raises(FileNotFoundError, match="ess.png"):
        publish(tables, figures, tmp_path / "committed" / "tables", tmp_path / "committed" / "figures")
    assert not (tmp_path / "committed").exists()
    with pytest.raises(ValueError, match="committed_tables_dir or committed_figures_dir is empty"):
        publish(tables, figures, "", "")
    with pytest.raises(ValueError, match="both the run's directory and the committed one"):
        publish(tables, figures, tables, tmp_path / "committed" / "figures")
