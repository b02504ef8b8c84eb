"""The study's outputs are one list (dlcrepro/report/outputs.py): every table and figure it names is drawn
by the package, written by the workflow's rules and shown in the report with its caption, and
nothing is drawn, written or reported that the list lacks."""

import inspect
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SMOKE
from dlcrepro.report import outputs


def test_the_list_imports_without_torch_pandas_or_matplotlib():
    code = "import sys, dlcrepro.report.outputs; print(sorted({'torch', 'pandas', 'matplotlib'} & set(sys.modules)))"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]"


def test_each_output_is_listed_once_with_a_caption():
    for items, kind in ((outputs.TABLES, "table"), (outputs.FIGURES, "figure")):
        names = [o.name for o in items]
        assert len(names) == len(set(names)), names
        assert all(o.kind == kind and o.caption.strip() for o in items)
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names), names
        assert all(sum(map(o.reported, o.files("out"))) == 1 for o in items)  # one file of each in the report


def test_every_listed_figure_is_drawn_and_every_figure_function_is_listed():
    """A figure function: one of figures.py's public functions returning a Figure from the steps
    (and runs) or from the findings table, named by its first parameter; each is registered
    (`@draws`) under the name of the figure it draws, which the list names as reading that input."""
    from dlcrepro.report import figures as F

    def figure_functions(first):
        return {
            name: f for name, f in vars(F).items()
            if inspect.isfunction(f) and f.__module__ == F.__name__ and not name.startswith("_")
            and inspect.signature(f).return_annotation in ("Figure", F.Figure)
            and next(iter(inspect.signature(f).parameters)) == first
        }

    for first, reads in (("steps", "runs"), ("findings", "findings")):
        functions = figure_functions(first)
        assert {name: F.FIGURES[name] for name in functions if name in F.FIGURES} == functions  # registered by its name
        assert set(functions) == {o.name for o in outputs.FIGURES if o.reads == reads}
    assert {o.reads for o in outputs.FIGURES} == {"runs", "findings"}
    assert set(F.FIGURES) == {o.name for o in outputs.FIGURES}
    assert F.drawn("noise_floor") is F.noise_floor
    with pytest.raises(LookupError, match="registered"):
        F.drawn("not_a_figure")


def test_every_listed_table_has_its_caption_in_the_tables():
    from dlcrepro.report import tables as T

    assert set(T.CAPTIONS) == {o.name for o in outputs.TABLES}


def test_the_report_captions_live_in_the_list_only():
    assert not (ROOT / "workflow" / "report").exists()


@pytest.mark.snakemake
def test_the_workflow_writes_and_reports_every_listed_output(tmp_path):
    """A dry run of the smoke grid's tables and figures jobs: their outputs are the list's files,
    and each output's report caption file holds its caption."""
    out = {"results_dir": tmp_path / "results", "tables_dir": tmp_path / "tables", "figures_dir": tmp_path / "figures"}
    p = subprocess.run([sys.executable, "-m", "snakemake", "--nolock", "-n", "--forceall", "--configfile", str(SMOKE),
                        "--config", *[f"{k}={v}" for k, v in out.items()], "--", "tables", "figures"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    written = {rule: line.split(": ", 1)[1].split(", ") for rule, line in
               re.findall(r"^rule (tables|figures):\n(?:    .*\n)*?(    output: .*)$", p.stdout, re.M)}
    assert written == {"tables": [f for o in outputs.TABLES for f in o.files(out["tables_dir"])]
                       + outputs.findings_input_files(out["tables_dir"]),
                       "figures": [f for o in outputs.FIGURES for f in o.files(out["figures_dir"])]}
    captions = {f.name: f.read_text() for f in (out["results_dir"] / "_report").iterdir()}
    listed = outputs.TABLES + outputs.FIGURES + (outputs.REPRODUCTION,)
    assert captions == {f"{o.name}.{o.kind}.rst": o.caption + "\n" for o in listed}
