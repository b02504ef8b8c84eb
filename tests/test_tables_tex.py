"""Every table's .tex compiles with pdflatex and booktabs, within the text width and a page's height:
the symbols the tables hold (✓, ✗, δ, λ, ±, <, †, ...) in math mode or escaped, long columns as
ragged paragraphs, a table taller than half a page as a longtable that breaks across pages (pdflatex
only warns of a float taller than a page: "Float too large", read from its log). TeX comes from
Debian's texlive-latex-base (pdflatex, array, longtable) and texlive-latex-recommended (booktabs)
(scripts/setup_tex.sh, run by scripts/setup.sh); without pdflatex this test fails, naming the script."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlcrepro.report import tables as T

NAN = math.nan
PREAMBLE = r"""\documentclass{article}
\usepackage[T1]{fontenc}
\usepackage{booktabs,array,longtable}
\begin{document}
"""


def pdflatex() -> str:
    exe = shutil.which("pdflatex")
    assert exe, "pdflatex not found: run scripts/setup_tex.sh (apt: texlive-latex-base texlive-latex-recommended)"
    return exe


def compile_tex(table: Path, workdir: Path) -> str:
    """pdflatex's log for a document holding `table`; fails the test on an error."""
    doc = workdir / f"{table.stem}_doc.tex"
    doc.write_text(PREAMBLE + table.read_text(encoding="utf-8") + "\n\\end{document}\n", encoding="utf-8")
    p = subprocess.run([pdflatex(), "-interaction=nonstopmode", "-halt-on-error", doc.name], cwd=workdir,
                       capture_output=True, text=True, timeout=120)
    log = (workdir / f"{doc.stem}.log").read_text(errors="replace") if (workdir / f"{doc.stem}.log").exists() else p.stdout
    assert p.returncode == 0, \
        f"{table.name} does not compile:\n" + "\n".join(line for line in log.splitlines() if line.startswith("!"))[:3000]
    return log


def overfull_points(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"Overfull \\hbox \((\d+(?:\.\d+)?)pt too wide\)", log)]


def pages(log: str) -> int:
    return int(re.search(r"Output written on .*?\((\d+) pages?", log, re.DOTALL).group(1))


def too_tall(log: str) -> list[str]:
    """pdflatex's warnings that something is taller than the page: a float, or a box it could not break."""
    return [ln for ln in log.splitlines() if "Float too large" in ln or ln.startswith("Overfull \\vbox")]


def a_study_with_everything() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every table's cells: the paper's seven corrections and ppo_multi under four samplers, two
    replicates, a diverged run, resyncs, collapses."""
    rows, runs = [], []
    for s in ("bf16", "fp8", "stale", "fp8_stale"):
        for c in ("pg", "center", "is", "is_center", "ppo_multi", "dlc", "is_resync"):
            for k in range(4):
                lagged = s in ("stale", "fp8_stale")
                acc = 0.45 if not lagged or c in ("dlc", "is_resync") else 0.05
                n = 8
                df = pd.DataFrame(dict(model="tiny", sampler=s, correction=c, seed=k, step=np.arange(1, n + 1),
                                       dev=np.linspace(1, 3 if lagged else 1.2, n) * (1 + 0.1 * k), floor=1.0,
                                       ess_lag=np.linspace(1, 0.3, n) if lagged else 1.0, ess_lag_presync=NAN,
                                       ess_lag_gauss=np.linspace(1, 0.4, n) if lagged else 1.0,
                                       test_accuracy=[NAN, 0.3, NAN, 0.35, NAN, 0.4, NAN, acc], off_support=0.5 - acc,
                                       kl_sampler=0.1, resync=0, discrepancy_mean_abs=0.02, lag_mean_abs=np.linspace(0.1, 5, n)))
                df["dev_ratio"] = df["dev"] / df["floor"]
                rows.append(df)
                runs.append(dict(model="tiny", sampler=s, correction=c, seed=k, final_test_accuracy=acc,
                                 initial_test_accuracy=0.25,
                                 resync_steps=json.dumps([3, 6] if c in ("dlc", "is_resync") and lagged else []), computed_as="",
                                 diverged_at_step=7.0 if (c, s, k) == ("ppo_multi", "stale", 1) else NAN))
    return pd.concat(rows, ignore_index=True), pd.DataFrame(runs)


def test_every_table_compiles_and_fits_the_text_width(tmp_path):
    steps, runs = a_study_with_everything()
    T.write_all(steps, runs, tmp_path, n_boot=50, replicates=[[0, 1], [2, 3]])
    tex = sorted(tmp_path.glob("*.tex"))
    assert {p.stem for p in tex} == set(T.CAPTIONS)
    findings = (tmp_path / "findings.tex").read_text()
    assert "✓" not in findings and r"$\surd$" in findings and "$\\lambda$" in findings
    for table in tex:
        log = compile_tex(table, tmp_path)
        too_wide = [pt for pt in overfull_points(log) if pt > 5]
        assert not too_wide, f"{table.name}: lines wider than the text by {too_wide} pt"
        assert not too_tall(log), f"{table.name}: taller than a page: {too_tall(log)}"


def test_a_table_taller_than_half_a_page_breaks_across_pages_and_a_short_one_stays_a_float(tmp_path):
    """The zoo's 64 rows (16 corrections x 4 samplers) and the findings' long cells run past a page
    as floats; as a longtable they break between rows, the header repeated on each page."""
    long = pd.DataFrame({"correction": [f"row{i}" for i in range(64)], "sampler": "fp8_stale",
                         "M (mean [95 % CI])": "1.21 [1.01, 1.48] (a cell with some words in it)"})
    short = long.head(4)
    assert T.tex_height(long, "a caption") > T.TEX_FLOAT_MAX_PT >= T.tex_height(short, "a caption")
    for name, df, form, n_pages in (("long", long, r"\begin{longtable}", 2), ("short", short, r"\begin{table}", 1)):
        path = tmp_path / f"{name}.tex"
        path.write_text(T.to_tex(df, "a caption"), encoding="utf-8")
        assert form in path.read_text()
        log = compile_tex(path, tmp_path)
        assert not too_tall(log) and pages(log) == n_pages, name
    assert (tmp_path / "long.tex").read_text().count("row") == 64  # every row, none lost at the break


def test_tex_escaping_puts_symbols_in_math_and_refuses_what_it_does_not_know():
    assert T._tex_escape("✓ λ 0.1 -> 6.1 < 2 ± 0.3") == r"$\surd$ $\lambda$ 0.1 -\textgreater{} 6.1 \textless{} 2 $\pm$ 0.3"
    assert T._tex_escape("5×δ") == r"5$\times \delta$"  # neighbouring symbols: one math span
    assert T._tex_escape("100 % of a_b & c$") == r"100 \% of a\_\allowbreak{}b \& c\$"  # a line may break after _ and /
    with pytest.raises(ValueError, match="U\\+263A"):
        T._tex_escape("☺")


@pytest.mark.parametrize("table", sorted(str(p.relative_to(Path(__file__).parents[1])) for p in
                                        Path(__file__).parents[1].glob("paper_tables/**/*.tex")))
def test_every_committed_table_compiles_within_the_text_width(table, tmp_path):
    log = compile_tex(Path(__file__).parents[1] / table, tmp_path)
    too_wide = [pt for pt in overfull_points(log) if pt > 5]
    assert not too_wide, f"{table}: lines wider than the text by {too_wide} pt"
    assert not too_tall(log), f"{table}: taller than a page: {too_tall(log)}"
