"""Statement coverage of the package before and after a change, function by function.

    .venv/bin/python bench/coverage_compare.py before.json after.json

Each argument is `coverage json` of one run of the suite (the README's test command with
pytest-cov, docs/measurements.md says how), taken in that checkout's root with
`--include '<checkout>/dlcrepro/*'` so that its files are named `dlcrepro/...`. A percentage alone
cannot say whether a behaviour covered before is still covered when the code changed in between;
functions keep their names across most changes. Printed: both totals; every function that ran
before and did not run after (or is gone); every function that misses more of its statements
after. Files and functions new after are in the totals only. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def functions(report: dict) -> dict[tuple[str, str], dict]:
    """(file, qualified function name) -> its summary; module level is the function ''."""
    return {(path, name): f["summary"] for path, data in report["files"].items() for name, f in data["functions"].items()}


def total(report: dict) -> tuple[int, int]:
    t = report["totals"]
    return t["num_statements"], t["missing_lines"]


def compare(before: dict, after: dict) -> dict[str, list]:
    b, a = functions(before), functions(after)
    lost, gone, more_missed = [], [], []
    for key, sb in sorted(b.items()):
        if sb["covered_lines"] == 0:
            continue
        sa = a.get(key)
        if sa is None:
            gone.append(key)
        elif sa["covered_lines"] == 0:
            lost.append(key)
        elif sa["missing_lines"] > sb["missing_lines"]:
            more_missed.append((key, sb["missing_lines"], sa["missing_lines"], sa["num_statements"]))
    return {"lost": lost, "gone": gone, "more_missed": more_missed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    args = p.parse_args()
    before, after = (json.loads(f.read_text()) for f in (args.before, args.after))
    for name, report in (("before", before), ("after", after)):
        n, missed = total(report)
        print(f"{name}: {n} statements, {missed} missed, {100 * (n - missed) / n:.2f} % covered")
    c = compare(before, after)
    print(f"functions run before and not after: {len(c['lost'])}")
    for path, name in c["lost"]:
        print(f"  {path}:{name or '<module>'}")
    print(f"functions run before and gone after (renamed, moved or removed): {len(c['gone'])}")
    for path, name in c["gone"]:
        print(f"  {path}:{name or '<module>'}")
    print(f"functions missing more statements after: {len(c['more_missed'])}")
    for (path, name), mb, ma, n in c["more_missed"]:
        print(f"  {path}:{name or '<module>'}: {mb} -> {ma} missed of {n}")


if __name__ == "__main__":
    main()
