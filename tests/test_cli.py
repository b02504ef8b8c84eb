"""The command line's maintenance commands and its refusals of bad arguments (no model, no engine)."""

import re
import shutil

import pytest

from conftest import ROOT, SMOKE
from dlcrepro.run.cli import main


@pytest.mark.parametrize(
    "argv, says",
    [
        (["warmstart", "--config", str(SMOKE), "--set", "train.lr"], "--set expects KEY=VALUE, got 'train.lr'"),
        (["tables", "--steps", "steps.parquet"], "tables: give --steps and --runs (or --redraw-tex DIR)"),
        (["scan", "--config", str(SMOKE), "--sampler", "bf16"], "scan: --corrections, --out required (unless --redraw)"),
        (["scan", "--redraw", "raw.parquet", "--tables-out", "t"],
         "scan --redraw: give --out (or --tables-out and --figures-out)"),
        (["plan", "--config", str(SMOKE), "--calibrate", "no/such/results"],
         "plan --calibrate no/such/results: no such directory"),
    ],
    ids=["set-without-value", "tables-without-runs", "scan-without-corrections", "redraw-without-figures-out",
         "calibrate-missing-dir"],
)
def test_a_command_missing_what_it_needs_stops_naming_the_option(argv, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=re.escape(says)):
        main(argv)
    assert list(tmp_path.iterdir()) == []  # refused before writing anything


def test_plan_calibrate_on_results_without_a_finished_job_says_to_run_the_pilot(tmp_path):
    with pytest.raises(SystemExit,
                       match=r"no finished job of 'smoke'.*run the pilot first: snakemake --configfile <config> pilot"):
        main(["plan", "--config", str(SMOKE), "--calibrate", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # no calibration file from nothing


def test_docs_rewrites_a_stale_generated_block_from_the_findings_table_and_nothing_else(tmp_path, capsys):
    """`python -m dlcrepro docs`: a page whose generated block no longer says what findings.csv says
    gets the block back; text outside the blocks and an up-to-date page are left as they are."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "paper_tables").mkdir()
    for f in ("README.md", "docs/results.md", "paper_tables/findings.csv"):
        shutil.copy(ROOT / f, tmp_path / f)
    readme = tmp_path / "README.md"
    committed = readme.read_text(encoding="utf-8")
    begin = committed.index("<!-- begin findings-table ")
    end = committed.index("<!-- end findings-table -->")
    stale = committed[:begin] + committed[begin:end].replace("|", "¦") + committed[end:] + "\nA line outside every block.\n"
    readme.write_text(stale, encoding="utf-8")

    assert main(["docs", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"rewrote {readme}\n"  # docs/results.md was up to date
    assert readme.read_text(encoding="utf-8") == committed + "\nA line outside every block.\n"
    assert main(["docs", "--root", str(tmp_path)]) == 0 and capsys.readouterr().out == ""


def test_tables_redraw_tex_rewrites_each_tex_as_its_md_shows_the_table(tmp_path, capsys):
    """`tables --redraw-tex`: the committed tables' .tex come back from their .md alone, blank cells
    blank and missing numbers "n/a", as `tables` wrote them."""
    for f in (ROOT / "paper_tables").glob("*.*"):
        shutil.copy(f, tmp_path / f.name)
    written = sorted(tmp_path.glob("*.tex"))
    for tex in written:
        tex.write_text("stale\n", encoding="utf-8")
    assert main(["tables", "--redraw-tex", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"rewrote {t}" for t in written]
    for tex in written:
        assert tex.read_text(encoding="utf-8") == (ROOT / "paper_tables" / tex.name).read_text(encoding="utf-8"), tex.name


def test_tables_redraw_tex_refuses_a_md_and_csv_that_are_not_one_table(tmp_path, capsys):
    for f in ("accuracy.csv", "accuracy.md", "accuracy.tex"):
        shutil.copy(ROOT / "paper_tables" / f, tmp_path / f)
    md = tmp_path / "accuracy.md"
    md.write_text("".join(md.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]), encoding="utf-8")  # one row fewer
    assert main(["tables", "--redraw-tex", str(tmp_path)]) == 2
    assert re.search(r"^error: .*accuracy\.md shows \d+ rows .*accuracy\.csv has \d+ .*not one table", capsys.readouterr().err)
    assert (tmp_path / "accuracy.tex").read_bytes() == (ROOT / "paper_tables" / "accuracy.tex").read_bytes()  # left as it was


def test_an_unknown_name_in_a_job_exits_2_in_one_line_before_writing(tmp_path, capsys):
    """A user's mistake (here a sampler wildcard no sampler registers) ends in one line naming the
    known ones, exit status 2, nothing written."""
    argv = ["train", "--config", str(SMOKE), "--model", "tiny", "--sampler", "fp4", "--correction", "dlc", "--seed", "0",
            "--out", str(tmp_path / "cell")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "error: unknown sampler 'fp4'; known: ['bf16', 'fp8', 'fp8_stale', 'stale']\n", err
    assert list(tmp_path.iterdir()) == []


def test_an_internal_key_error_keeps_its_traceback(monkeypatch):
    """A KeyError from the code itself is a bug, not a user's mistake: it propagates (the interpreter
    prints its traceback and exits 1) instead of becoming a one-line exit 2."""
    import dlcrepro.run.cli as cli

    def broken(args):
        return {}["no such key"]

    monkeypatch.setattr(cli, "cmd_plan", broken)
    with pytest.raises(KeyError, match="no such key"):
        main(["plan", "--config", str(SMOKE)])
