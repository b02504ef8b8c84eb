"""Publishing a finished run as the committed study: its tables, findings input and figures copied
over the committed ones (config `committed_tables_dir`, `committed_figures_dir`). The one command that
writes the committed `paper_tables/` and `figures/` (`snakemake publish`, `python -m dlcrepro
publish`); a run itself writes only under its own directories (docs/workflow.md#which-commands-regenerate-the-committed-results).
"""

from __future__ import annotations

from pathlib import Path

from . import outputs
from ..core.util import atomic_write_bytes


def published_files(tables_from: Path | str, figures_from: Path | str) -> list[Path]:
    """What a run publishes: every table (outputs.TABLES, each format), the findings input, every
    figure (outputs.FIGURES, each format); never the run's reproduction report, which is about the
    committed study it would replace."""
    tables = [Path(f) for o in outputs.TABLES for f in o.files(tables_from)]
    tables += [Path(f) for f in outputs.findings_input_files(tables_from)]
    return tables + [Path(f) for o in outputs.FIGURES for f in o.files(figures_from)]


def publish(tables_from: Path | str, figures_from: Path | str, tables_to: Path | str, figures_to: Path | str) -> list[Path]:
    """Copy a finished run's outputs (`published_files`) into the committed directories, each file
    atomically; the files written. Refuses, before writing anything, a run with a file missing and a
    destination that is the run's own directory."""
    if not str(tables_to) or not str(figures_to):
        raise ValueError("nothing to publish to: config key committed_tables_dir or committed_figures_dir is empty "
                         "(this config names no committed study)")
    pairs = [(Path(tables_from), Path(tables_to)), (Path(figures_from), Path(figures_to))]
    for source, dest in pairs:
        if source.resolve() == dest.resolve():
            raise ValueError(f"publish: {source} is both the run's directory and the committed one")
    files = published_files(tables_from, figures_from)
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"publish: the run is not finished, {len(missing)} of its files are missing "
                                f"({', '.join(missing[:3])}{'…' if len(missing) > 3 else ''}): run its workflow first")
    written = []
    for f in files:
        source, dest = next((s, d) for s, d in pairs if f.parent == s)
        target = dest / f.name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, f.read_bytes())
        written.append(target)
    return written
