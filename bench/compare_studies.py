"""Whether two studies computed the same numbers: every cell, every column but the timings.

    .venv/bin/python bench/compare_studies.py BEFORE/results AFTER/results [--cells 'tiny/stale/*/seed0']
    .venv/bin/python bench/compare_studies.py --findings-input paper_tables/other_machines/avx512-epyc-3bea749 RUN/paper_tables

For a change that is not meant to be numerical (issue #30: sharing work, skipping work done twice),
run the study before and after it on the same machine and compare. Each cell found in both (by its
`<model>/<sampler>/<correction>/seed<k>` directory) is compared on its metrics table, every column
but the `sec_*` timings, bit for bit (NaN equal to NaN), and on its summary, every key but the
seconds, the file digest and paths. Prints one line per cell that differs, naming the columns, then
a count; exits 1 if any cell differs or none was compared. A benchmark's tool, not a test.
`--added-columns`: for a change that adds columns (issue #68's mismatch parts), a column only AFTER
has is not a difference; every column BEFORE has is still compared.

`--findings-input`: the two directories hold a study's findings input (`findings_steps.csv`,
`findings_runs.csv`: what the tables job writes, and what `paper_tables/other_machines/` keeps of
another machine's run, whose per-cell files are not committed). The runs found in both (by model,
sampler, correction, seed) are compared column by column, NaN equal to NaN (dlcrepro/report/reproduce.py, as
the workflow's `reproduce` rule at the end of every run); a run of one replicate against a committed
input of two compares the seeds they share.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's package, as the workflow reads it
from dlcrepro.report.reproduce import DIFFERS, ONLY_HERE, cell_differences, read_study  # noqa: E402

# summary keys that say how long, where or from which file, not what was computed
# (`process`, `startup_seconds`: whether the job ran in a fork server's child and how long it took to start)
NOT_COMPUTED = {"seconds_by_phase", "wall_seconds", "steps_timed", "peak_host_rss_mb", "device_memory", "metrics_file",
                "model_dir", "computed_as", "tracking", "process", "startup_seconds"}


def cells(root: Path, pattern: str) -> dict[str, Path]:
    return {str(p.parent.relative_to(root)): p.parent for p in sorted(root.glob(f"{pattern}/metrics.parquet"))}


def same_values(a: pd.Series, b: pd.Series) -> bool:
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
        return bool(np.array_equal(x, y, equal_nan=True))
    return a.astype(object).tolist() == b.astype(object).tolist()


def differences(a: Path, b: Path, added: bool = False) -> list[str]:
    """What differs between two cells' numbers: column and summary-key names (`added`: a column only
    the second has is new, not a difference)."""
    ma, mb = pd.read_parquet(a / "metrics.parquet"), pd.read_parquet(b / "metrics.parquet")
    out = []
    if len(ma) != len(mb):
        out.append(f"rows {len(ma)} vs {len(mb)}")
    cols_a = {c for c in ma if not c.startswith("sec_")}
    cols_b = {c for c in mb if not c.startswith("sec_")}
    out += [f"column {c} only in one" for c in sorted((cols_a - cols_b) if added else (cols_a ^ cols_b))]
    if len(ma) == len(mb):
        out += [f"column {c}" for c in sorted(cols_a & cols_b) if not same_values(ma[c], mb[c])]
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    keys = (set(sa) | set(sb)) - NOT_COMPUTED
    out += [f"summary {k}" for k in sorted(keys) if json.dumps(sa.get(k)) != json.dumps(sb.get(k))]
    return out


def findings_input_differences(a: Path, b: Path) -> tuple[int, list[str]]:
    """The runs both findings inputs hold, and what differs in them: per run, its columns
    (reproduce.cell_differences, what the workflow's `reproduce` rule reports)."""
    cells = cell_differences(read_study(b), read_study(a))
    compared = cells[cells["status"] != ONLY_HERE]
    return len(compared), [f"{c.model}/{c.sampler}/{c.correction}/seed{c.seed}: {c.columns}"
                           for c in compared.itertuples() if c.status == DIFFERS]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="a study's results directory")
    p.add_argument("after", type=Path)
    p.add_argument("--cells", default="*/*/*/seed*", help="glob of cell directories under each (default: all)")
    p.add_argument("--findings-input", action="store_true",
                   help="compare two findings inputs (directories with findings_steps.csv, findings_runs.csv)")
    p.add_argument("--added-columns", action="store_true",
                   help="columns only AFTER's tables have are new, not a difference (a change that adds metrics: "
                        "every column BEFORE has must still be equal)")
    args = p.parse_args()
    if args.findings_input:
        compared, diff = findings_input_differences(args.before, args.after)
        print("\n".join(diff + [f"{compared} runs compared, {'some columns differ' if diff else 'every column equal'}"]))
        return 1 if diff or not compared else 0
    a, b = cells(args.before, args.cells), cells(args.after, args.cells)
    both = sorted(set(a) & set(b))
    differ = 0
    for name in both:
        diff = differences(a[name], b[name], args.added_columns)
        if diff:
            differ += 1
            print(f"{name}: {', '.join(diff)}")
    only = sorted(set(a) ^ set(b))
    print(f"{len(both)} cells compared, {differ} differ; {len(only)} in one study only"
          + (f" ({', '.join(only[:5])}…)" if only else ""))
    return 1 if differ or not both else 0


if __name__ == "__main__":
    sys.exit(main())
