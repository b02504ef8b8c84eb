"""The test suite's profile: per test, wall seconds and the machine's busy CPU seconds.

Record (a pytest plugin; the suite as the README runs it, plus this):

    PYTHONPATH=bench SUITE_PROFILE=profile.json .venv/bin/python -m pytest -q -p suite_profile

Summarize one profile, or compare two (the slowest tests, each file's total, the whole):

    .venv/bin/python bench/suite_profile.py profile.json [other.json] [--top 25] [--file-seconds tests/file_seconds.json]

`--file-seconds` records each test file's seconds, which the suite reads to hand its longest files
to the workers first (tests/conftest.py).

The CPU seconds are the whole machine's (user + system of every process, from /proc/stat), not
pytest's own: a test's work runs in Slurm jobs, snakemake jobs and engine processes that are not
its children. So they are meaningful only for a run alone on the machine; CPU seconds well under
2x the wall seconds on 2 cores mean the test mostly waits (Slurm's status polls, a requeue's hold,
process starts). A test's row includes its fixtures' set-up when it is the first to need them:
a session fixture's cost lands on the first test that asks for it. A benchmark, not a test.

Under `pytest -n 3` (pytest-xdist) each worker records its own tests (`<profile>.gw0.json`, ...)
and the controller merges them into the profile with the run's own wall and machine CPU seconds:
each test's wall seconds still are its own, but its CPU seconds then include what the other workers
ran meanwhile, so only the run's total CPU compares between runs.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from collections import defaultdict

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROWS: list[dict] = []


def busy_cpu_seconds() -> float:
    """User + system (+ irq, softirq, steal) seconds of every CPU since boot."""
    with open("/proc/stat") as fh:
        fields = fh.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def _hookwrapper(fn):
    import pytest

    return pytest.hookimpl(hookwrapper=True)(fn)


@_hookwrapper
def pytest_runtest_protocol(item, nextitem):
    wall, cpu = time.monotonic(), busy_cpu_seconds()
    yield
    ROWS.append({"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 2), "cpu_s": round(busy_cpu_seconds() - cpu, 2)})


RUN: dict[str, float] = {}


def _path() -> str:
    return os.environ.get("SUITE_PROFILE", "suite_profile.json")


def pytest_sessionstart(session):
    RUN.update(wall=time.monotonic(), cpu=busy_cpu_seconds())


def pytest_sessionfinish(session, exitstatus):
    worker, stem = os.environ.get("PYTEST_XDIST_WORKER"), _path().removesuffix(".json")
    if worker:  # the controller merges the workers' files
        with open(f"{stem}.{worker}.json", "w") as fh:
            json.dump([{**r, "worker": worker} for r in ROWS], fh, indent=0)
        return
    rows = list(ROWS)
    for part in sorted(glob.glob(f"{glob.escape(stem)}.gw*.json")):
        rows += json.load(open(part))
        os.remove(part)
    run = {"wall_s": round(time.monotonic() - RUN["wall"], 1), "cpu_s": round(busy_cpu_seconds() - RUN["cpu"], 1)}
    with open(_path(), "w") as fh:
        json.dump({"run": run, "tests": rows}, fh, indent=0)


def load(path: str) -> tuple[dict | None, list[dict]]:
    """(the run's own wall and CPU seconds, or None in a profile from before they were recorded; the rows)."""
    data = json.load(open(path))
    return (None, data) if isinstance(data, list) else (data["run"], data["tests"])


# ----------------------------------------------------------------------------- summary


def by_file(rows: list[dict]) -> dict[str, tuple[float, float, int]]:
    """(wall seconds, CPU seconds, tests) per test file."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = out[r["test"].split("::")[0]]
        f[0] += r["wall_s"]
        f[1] += r["cpu_s"]
        f[2] += 1
    return {k: tuple(v) for k, v in out.items()}


def summarize(path: str, top: int) -> dict[str, tuple[float, float, int]]:
    run, rows = load(path)
    wall, cpu = sum(r["wall_s"] for r in rows), sum(r["cpu_s"] for r in rows)
    if run is None or len({r.get("worker") for r in rows}) == 1:
        print(f"## {path}: {len(rows)} tests, {wall:.0f} s wall, {cpu:.0f} s CPU (machine)\n")
    else:  # tests ran side by side: their seconds overlap; the run's own are the measure
        print(f"## {path}: {len(rows)} tests on {len({r['worker'] for r in rows})} workers, the run {run['wall_s']:.0f} s wall, "
              f"{run['cpu_s']:.0f} s CPU (machine); the tests' own wall seconds sum to {wall:.0f}\n")
    print("| test | wall s | CPU s |\n|---|---:|---:|")
    for r in sorted(rows, key=lambda r: -r["wall_s"])[:top]:
        print(f"| `{r['test']}` | {r['wall_s']:.1f} | {r['cpu_s']:.1f} |")
    files = by_file(rows)
    print("\n| file | tests | wall s | CPU s |\n|---|---:|---:|---:|")
    for name, (w, c, n) in sorted(files.items(), key=lambda kv: -kv[1][0]):
        print(f"| `{name}` | {n} | {w:.0f} | {c:.0f} |")
    print()
    return files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", help="one profile, or two to compare (before, after)")
    ap.add_argument("--top", type=int, default=25, help="the slowest tests to list")
    ap.add_argument("--file-seconds", metavar="JSON", help="write the last profile's wall seconds per test file here "
                    "(tests/file_seconds.json: the order in which the suite hands files to its workers, tests/conftest.py)")
    args = ap.parse_args()
    files = [summarize(p, args.top) for p in args.profiles]
    if args.file_seconds:
        with open(args.file_seconds, "w") as fh:
            json.dump({name: round(w) for name, (w, _, _) in sorted(files[-1].items())}, fh, indent=1)
            fh.write("\n")
    if len(files) == 2:
        before, after = files
        print("| file | wall s before | wall s after |\n|---|---:|---:|")
        for name in sorted(set(before) | set(after), key=lambda n: -before.get(n, (0,))[0]):
            print(f"| `{name}` | {before.get(name, (0,))[0]:.0f} | {after.get(name, (0,))[0]:.0f} |")


if __name__ == "__main__":
    main()
