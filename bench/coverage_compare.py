"""Statement coverage of the package before and after a change, function by function.

    .venv/bin/python bench/coverage_compare.py before.json after.json

Each argument is `coverage json` of one run of the suite (the README's test command with
pytest-cov, docs/measurements.md says how), taken in that checkout's root with
`--include '<checkout>/dlcrepro/*'` so that its files are named `dlcrepro/...`. A percentage alone
cannot say whether a behaviour covered before is still covered when the code changed in between;
functions keep their names across most changes (a function moved to another file is found
there by its name). Printed: both totals; every function that ran before and did not run after (or
is gone); every function that misses more of its statements after. Files and functions new after
are in the totals only. A benchmark, not a test.
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
    """Every function that ran before, looked up after in its file, or else by its name in the one
    other file that has it (a function moved to another module, or a method to another class of
    the same name)."""
    b, a = functions(before), functions(after)
    files_of: dict[str, list[str]] = {}
    for path, name in a:
        files_of.setdefault(name, []).append(path)
    lost, gone, moved, more_missed = [], [], [], []
    for (path, name), sb in sorted(b.items()):
        if sb["covered_lines"] == 0:
            continue
        key = (path, name)
        if key not in a:
            elsewhere = files_of.get(name, []) if name else []
            if len(elsewhere) != 1:
                gone.append(key)
                continue
            moved.append((key, elsewhere[0]))
            key = (elsewhere[0], name)
        sa = a[key]
        if sa["covered_lines"] == 0:
            lost.append(key)
        elif sa["missing_lines"] > sb["missing_lines"]:
            more_missed.append((key, sb["missing_lines"], sa["missing_lines"], sa["num_statements"]))
    return {"lost": lost, "gone": gone, "moved": moved, "more_missed": more_missed}


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
    print(f"functions run before and moved to another file after: {len(c['moved'])} (compared there)")
    print(f"functions run before and gone after (renamed, split or removed; a removed module's own lines): {len(c['gone'])}")
    for path, name in c["gone"]:
        print(f"  {path}:{name or '<module>'}")
    print(f"functions missing more statements after: {len(c['more_missed'])}")
    for (path, name), mb, ma, n in c["more_missed"]:
        print(f"  {path}:{name or '<module>'}: {mb} -> {ma} missed of {n}")


if __name__ == "__main__":
    main()
