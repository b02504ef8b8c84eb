"""When each pytest-xdist worker would end, for the order the suite hands out its files now.

    .venv/bin/python bench/suite_order.py profile.json [--workers 2]

Takes each test's wall seconds from a profile (bench/suite_profile.py) and replays
pytest-xdist's `--dist loadfile` rule over the files in the order this checkout collects them
(tests/conftest.py: heaviest marker first, then tests/file_seconds.json): each worker starts with
one file and is handed the next when two or fewer of its tests are left. A test keeps the seconds it
took in the profile, though beside other tests it would take others: a simulation of the order, not
a measurement of the suite. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from suite_profile import load  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def collected_files() -> list[str]:
    """The test files in the order this checkout's suite runs them."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return list(dict.fromkeys(line.split("::")[0] for line in out.splitlines() if "::" in line))


def replay(files: list[str], seconds: dict[str, list[float]], workers: int) -> list[float]:
    """Each worker's end, in seconds, under xdist's loadfile rule (LoadScopeScheduling)."""
    queue = [f for f in files if f in seconds]
    clock, pending = [0.0] * workers, [[] for _ in range(workers)]

    def hand_out(w: int) -> None:
        if queue:
            pending[w] += seconds[queue.pop(0)]

    for w in range(workers):
        hand_out(w)
    for w in range(workers):
        if len(pending[w]) <= 2:
            hand_out(w)
    while any(pending):
        w = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w] + pending[w][0])
        clock[w] += pending[w].pop(0)
        if len(pending[w]) <= 2:
            hand_out(w)
    return clock


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    _, rows = load(args.profile)
    seconds: dict[str, list[float]] = {}
    for r in rows:
        seconds.setdefault(r["test"].split("::")[0], []).append(r["wall_s"])
    files = collected_files()
    ends = replay(files, seconds, args.workers)
    print(f"files in the suite's order: {', '.join(Path(f).stem for f in files[:8])}, ...")
    print("workers end at " + ", ".join(f"{e:.0f} s" for e in ends)
          + f" (the profile's own run: {sum(map(sum, seconds.values())):.0f} s of tests)")


if __name__ == "__main__":
    main()
