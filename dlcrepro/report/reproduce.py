"""Whether a run reproduced the committed study: its findings input against the committed one, cell
by cell, and, where they differ or come from another kind of CPU, each finding's verdict beside the
committed one. The workflow's `reproduce` rule writes it at the end of every run
(`python -m dlcrepro reproduce`): a short markdown report, one figure, and its headline, which the
Snakefile prints last.

The committed input compared with is the one made on this run's kind of CPU where one is committed
(`<committed>/findings_*.csv`, or a folder `<committed>/other_machines/<name>/`), else the main one;
the report says which, with both CPU kinds. Only the runs both inputs hold are compared (the main
command's seeds 0-2 against a committed study of seeds 0-5): the report names the rest.
Functions from tables to tables, like findings.py; I/O in `write_report`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import outputs
from .findings import findings_from_input

RUN = ["model", "sampler", "correction", "seed"]
# what the findings input records of where and how it was grouped, not what a cell computed
NOT_NUMBERS = ("machine", "replicates")
EQUAL, DIFFERS, ONLY_HERE = "equal", "differs", "not in the committed study"


@dataclass(frozen=True)
class Study:
    """A findings input as read from its folder: per run and step, per run, and its CPU kind."""

    where: str
    steps: pd.DataFrame
    runs: pd.DataFrame

    @property
    def machine(self) -> str:
        return str(self.runs["machine"].iloc[0]) if len(self.runs) and "machine" in self.runs else "unknown CPU"

    @property
    def seeds(self) -> list[int]:
        return sorted(int(s) for s in self.runs["seed"].unique())


def read_study(directory: Path | str) -> Study:
    """The findings input in `directory` (outputs.FINDINGS_INPUT), read as the tables job wrote it."""
    paths = [Path(directory) / name for name in outputs.FINDINGS_INPUT]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"no findings input {', '.join(missing)} (the tables job writes it)")
    steps, runs = (pd.read_csv(p) for p in paths)
    return Study(str(directory), steps, runs)


def committed_inputs(committed: Path | str) -> list[Path]:
    """The folders holding a committed findings input: `committed` itself and each
    `committed/other_machines/<name>/` (outputs.other_machine_files), in that order."""
    committed = Path(committed)
    found = [committed] if all((committed / n).exists() for n in outputs.FINDINGS_INPUT) else []
    folders = sorted({Path(f).parent for f in outputs.other_machine_files(committed) if Path(f).name in outputs.FINDINGS_INPUT})
    return found + [f for f in folders if all((f / n).exists() for n in outputs.FINDINGS_INPUT)]


def pick(candidates: list[Study], machine: str) -> tuple[Study, bool]:
    """The committed study made on `machine`'s kind of CPU, else the first (the main one); and
    whether the kinds are the same."""
    same = [s for s in candidates if s.machine == machine]
    return (same[0], True) if same else (candidates[0], False)


def _same(a: pd.Series, b: pd.Series) -> np.ndarray:
    """Element by element: equal, NaN equal to NaN (a blank text cell reads back as NaN)."""
    if a.dtype.kind in "fciub" and b.dtype.kind in "fciub":
        x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
        return (x == y) | (np.isnan(x) & np.isnan(y))
    x, y = a.astype(object), b.astype(object)
    return ((x == y) | (x.isna() & y.isna())).to_numpy()


def _gap(a: pd.Series, b: pd.Series) -> np.ndarray:
    """Element by element: |a - b| for numbers, NaN for text or where one side is missing."""
    if a.dtype.kind in "fciub" and b.dtype.kind in "fciub":
        return np.abs(a.to_numpy(dtype=float) - b.to_numpy(dtype=float))
    return np.full(len(a), np.nan)


def _table_differences(here: pd.DataFrame, there: pd.DataFrame, key: list[str], name: str) -> pd.DataFrame:
    """Per run of `here`: the columns of table `name` that differ from `there` on the same rows
    (`<name>: rows` where a row is in one only), and the largest numeric difference."""
    columns = [c for c in here.columns if c in there.columns and c not in key and c not in NOT_NUMBERS]
    m = here.merge(there, on=key, how="outer", suffixes=("", " committed"), indicator=True)
    out = {}
    for run, g in m.groupby(RUN, sort=True):
        differ = [f"{name}: rows"] if (g["_merge"] != "both").any() else []
        both = g[g["_merge"] == "both"]
        largest = np.nan
        for c in columns:
            same = _same(both[c], both[f"{c} committed"])
            if not same.all():
                differ.append(f"{name}: {c}")
                gap = _gap(both[c], both[f"{c} committed"])[~same]
                if np.isfinite(gap).any():
                    largest = np.nanmax([largest, np.nanmax(gap)])
        out[run] = (differ, largest)
    return out


def cell_differences(run: Study, committed: Study) -> pd.DataFrame:
    """One row per run of `run` (model, sampler, correction, seed): `status` (equal, differs, or
    not in the committed study), `columns` (which differ, per file) and `largest difference` (the
    largest absolute difference of a number that differs; NaN where only text or rows differ).
    Compared over the runs both hold; every column but where they ran (NOT_NUMBERS)."""
    shared = run.runs[RUN].merge(committed.runs[RUN])
    rows = []
    if len(shared):
        pick_ = {n: t.merge(shared) for n, t in (("here runs", run.runs), ("there runs", committed.runs),
                                                  ("here steps", run.steps), ("there steps", committed.steps))}
        per_run = _table_differences(pick_["here runs"], pick_["there runs"], RUN, "findings_runs.csv")
        per_step = _table_differences(pick_["here steps"], pick_["there steps"], RUN + ["step"], "findings_steps.csv")
    for r in run.runs[RUN].itertuples(index=False):
        key = tuple(r)
        if len(shared) == 0 or key not in per_run:
            rows.append({**dict(zip(RUN, key)), "status": ONLY_HERE, "columns": "", "largest difference": np.nan})
            continue
        (a, la), (b, lb) = per_run[key], per_step.get(key, ([], np.nan))
        differ = a + b
        rows.append({**dict(zip(RUN, key)), "status": DIFFERS if differ else EQUAL, "columns": ", ".join(differ),
                     "largest difference": np.nanmax([la, lb]) if np.isfinite([la, lb]).any() else np.nan})
    return pd.DataFrame(rows, columns=RUN + ["status", "columns", "largest difference"])


def restricted(study: Study, runs: pd.DataFrame) -> Study:
    """`study` cut to the runs in `runs` (model, sampler, correction, seed)."""
    keys = runs[RUN].drop_duplicates()
    return Study(study.where, study.steps.merge(keys), study.runs.merge(keys))


def verdicts(study: Study, n_boot: int = 1000) -> pd.DataFrame:
    """Each finding's verdict (finding, model, verdict) as the findings table computes it from a
    findings input (findings.findings_from_input; its pooled `verdict` and the seeds it pools): the one
    place that reads it."""
    table = findings_from_input(study.steps, study.runs, n_boot)
    return table[["finding", "model", "verdict", "seeds"]]


def verdicts_side_by_side(run: Study, committed: Study, n_boot: int = 1000) -> pd.DataFrame:
    """Each finding's verdict in this run beside the committed study's, both over the runs they share."""
    shared = run.runs[RUN].merge(committed.runs[RUN])
    here, there = verdicts(restricted(run, shared), n_boot), verdicts(restricted(committed, shared), n_boot)
    both = here.merge(there, on=["finding", "model"], suffixes=("", " committed"), how="left")  # the findings' order
    return both.assign(same=both["verdict"] == both["verdict committed"])


@dataclass(frozen=True)
class Reproduction:
    """What a run's comparison with the committed study found: `headline` (one line), the cells, and
    each finding's verdicts side by side where they were computed (None where every cell is equal)."""

    headline: str
    cells: pd.DataFrame
    verdicts: pd.DataFrame | None
    notes: list[str]


def _seeds(seeds: list[int]) -> str:
    return ",".join(map(str, seeds))


def compare(run: Study, candidates: list[Study], machine: str | None = None, n_boot: int = 1000) -> Reproduction:
    """This run against the committed study of its CPU kind (`machine`, by default the kind the run
    records: findings.cpu_kind() where its tables were written), else the main committed one
    (`candidates[0]`)."""
    machine = machine or run.machine
    committed, same_kind = pick(candidates, machine)
    cells = cell_differences(run, committed)
    compared = cells[cells["status"] != ONLY_HERE]
    n, differ = len(compared), int((compared["status"] == DIFFERS).sum())
    notes = [f"This run: {len(run.runs)} cells, seeds {_seeds(run.seeds)}, on {machine}. The committed study compared "
             f"with: `{committed.where}`, seeds {_seeds(committed.seeds)}, made on {committed.machine}"
             + (" (the same kind of CPU)." if same_kind else
                f" (no committed study of this kind: {', '.join(f'`{c.where}` {c.machine}' for c in candidates)}).")]
    only_here = len(cells) - n
    only_there = len(committed.runs[RUN].merge(run.runs[RUN], how="left", indicator=True).query("_merge == 'left_only'"))
    if only_here or only_there:
        notes.append(f"Compared over the {n} cells both hold; {only_here} of this run's are not in the committed study, "
                     f"{only_there} of the committed study's are not in this run.")
    what = "every number equal to the committed study" if not differ else \
        f"{differ} of them {'differs' if differ == 1 else 'differ'} from the committed study"
    kinds = f"both on {machine}" if same_kind else f"this run on {machine}, the committed study on {committed.machine}"
    headline = f"{n} cells, {what}" + (f" ({kinds})" if differ or not same_kind else "")
    if n == 0:
        headline = f"no cell of this run is in the committed study `{committed.where}`: nothing compared"
    table = verdicts_side_by_side(run, committed, n_boot) if n and (differ or not same_kind) else None
    if table is not None:
        headline += f"; {int(table['same'].sum())} of {len(table)} verdicts the same"
    return Reproduction(headline, cells, table, notes)


def nothing_to_compare(why: str) -> Reproduction:
    return Reproduction(f"not compared: {why}", pd.DataFrame(columns=RUN + ["status", "columns", "largest difference"]),
                        None, [])


def _number(x: float) -> str:
    return "" if not np.isfinite(x) else f"{x:.3g}"


def markdown(r: Reproduction, figure: str | None = None) -> str:
    """The report: the headline, where each side ran, each finding's verdicts side by side (where
    computed), and each cell: equal, or which columns differ and by how much at most."""
    lines = ["# Did this run reproduce the committed study?", "", f"**{r.headline}.**", ""] + [f"{n}" for n in r.notes]
    if figure:
        lines += ["", f"![cell by cell]({figure})"]
    if r.verdicts is not None:
        lines += ["", "## Verdicts, over the cells both hold", "", "| finding | model | this run | committed | |",
                  "|---|---|---|---|---|"]
        lines += [f"| {v['finding']} | {v['model']} | {v['verdict']} | {v['verdict committed']} | "
                  f"{'same' if v['same'] else '**differs**'} |" for v in r.verdicts.to_dict("records")]
    if len(r.cells):
        lines += ["", "## Cell by cell", "", "| model | sampler | correction | seed | numbers | columns that differ | "
                  "largest difference |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {c['model']} | {c['sampler']} | {c['correction']} | {c['seed']} | {c['status']} | {c['columns']} | "
                  f"{_number(c['largest difference'])} |" for c in r.cells.to_dict("records")]
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path | str, committed_dir: Path | str | None, out_md: Path | str, out_figure_dir: Path | str,
                 n_boot: int = 1000) -> Reproduction:
    """Compare the findings input in `run_dir` with the committed ones under `committed_dir`; write
    `out_md` and the figure `reproduce.{png,pdf}` in `out_figure_dir`. Nothing committed (no
    directory given, or none holding a findings input) is said in the report, not raised."""
    from .figures import save_reproduction
    from ..core.util import atomic_write_text

    run = read_study(run_dir)
    if not committed_dir:
        r = nothing_to_compare("this config names no committed study (config key `committed_tables_dir` is empty)")
    elif not committed_inputs(committed_dir):
        r = nothing_to_compare(f"the committed study `{committed_dir}` (config key `committed_tables_dir`) holds no findings "
                               f"input ({', '.join(outputs.FINDINGS_INPUT)})")
    else:
        r = compare(run, [read_study(d) for d in committed_inputs(committed_dir)], n_boot=n_boot)
    png = save_reproduction(r, Path(out_figure_dir))
    out_md = Path(out_md)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_md, markdown(r, os.path.relpath(png, out_md.parent)))
    return r
