"""Every weight-sync check a study ran, read from its jobs' logs: how many passed, how close the
largest came to the bound, how many could not tell, how many failed — per engine kind.

    .venv/bin/python bench/sync_log.py results [other results ...] [--top 5]

A trained cell's job logs one line per check that passed (`Trainer.push_weights`):

    sync check: bf16 engine holds version 7 (load manifest 9 ms): mean |log q − log π| 0.0038/token (bound 1.0) in 0.07 s

one "cannot tell" line when no drawn token was likely under the trainer (`VLLMEngine.check_sync`), and a
failed check raises (SyncCheckError, or Diverged when the weights had blown up: the run's outcome,
its step in summary.json). The logs are read as text, nothing in them is executed. A benchmark of
a finished study, not a test.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from collections import defaultdict

PASSED = re.compile(
    r"sync check: (?P<kind>.+?) engine holds (?:version (?P<version>\d+)|θ_0)"
    r" \(load manifest (?P<ms>\d+) ms\): mean \|log q − log π\| (?P<d>[0-9.eE+-]+)/token \(bound (?P<bound>[0-9.]+)\)"
)
CANNOT_TELL = re.compile(r"sync check: (?P<kind>.+?) engine, version (?P<version>\d+): cannot tell")
FAILED = re.compile(r"weight sync check failed: the (?P<kind>.+?) engine, given version (?P<version>\d+), computes mean \|log q "
                    r"− log π\| = (?P<d>[0-9.naN]+)")


def job_logs(results: str) -> list[str]:
    """Every job log of a results directory that can hold a sync check (trained cells, θ_0's
    evaluation, the shared rollouts)."""
    return sorted(glob.glob(os.path.join(results, "_logs", "**", "*.log"), recursive=True))


def read_checks(results: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(passed, cannot tell, failed) checks of one results directory, each with its log."""
    passed, unsure, failed = [], [], []
    for path in job_logs(results):
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read().replace("\r", "\n")  # progress bars share lines with log lines
        where = os.path.relpath(path, results)
        for m in PASSED.finditer(text):
            passed.append({"kind": m["kind"], "d": float(m["d"]), "bound": float(m["bound"]), "log": where})
        for m in CANNOT_TELL.finditer(text):
            unsure.append({"kind": m["kind"], "version": int(m["version"]), "log": where})
        for m in FAILED.finditer(text):
            failed.append({"kind": m["kind"], "d": float(m["d"]), "log": where})
    return passed, unsure, failed


DIVERGED = re.compile(r"step \d+: (?P<why>.+?): the run diverged")


def diverged_cells(results: str) -> list[tuple[str, int, str]]:
    """Cells whose summary.json records a divergence: the cell, its step and what its training log
    says diverged (non-finite weights or update, or a failed sync check after the weights blew up)."""
    out = []
    for path in sorted(glob.glob(os.path.join(results, "*", "*", "*", "*", "summary.json"))):
        with open(path) as fh:
            step = json.load(fh).get("diverged_at_step")
        if step is None:
            continue
        cell = os.path.relpath(os.path.dirname(path), results)
        why = "its log not found"
        log = os.path.join(results, "_logs", "train", cell + ".log")
        if os.path.exists(log):
            with open(log, encoding="utf-8", errors="replace") as fh:
                m = DIVERGED.search(fh.read().replace("\r", "\n"))
            why = m["why"] if m else "no divergence line in its log"
        out.append((cell, step, why))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--top", type=int, default=5, help="the largest passed checks to list")
    args = ap.parse_args()
    passed, unsure, failed, diverged = [], [], [], []
    for r in args.results:
        p, u, f = read_checks(r)
        passed += p
        unsure += u
        failed += f
        diverged += diverged_cells(r)
    by_kind = defaultdict(list)
    for c in passed:
        by_kind[c["kind"]].append(c["d"])
    print(f"{len(passed)} checks passed, {len(unsure)} could not tell, {len(failed)} failed "
          f"(logs of {', '.join(args.results)})")
    for kind, ds in sorted(by_kind.items()):
        ds.sort()
        print(f"  {kind}: {len(ds)} passed, median {ds[len(ds) // 2]:.4f}, 99th percentile "
              f"{ds[int(0.99 * (len(ds) - 1))]:.4f}, largest {ds[-1]:.4f}")
    for c in sorted(passed, key=lambda c: -c["d"])[: args.top]:
        print(f"  {c['d']:.4f} ({c['kind']}, bound {c['bound']}) in {c['log']}")
    for c in unsure:
        print(f"  cannot tell: {c['kind']} version {c['version']} in {c['log']}")
    for c in failed:
        print(f"  failed: {c['kind']} {c['d']} in {c['log']}")
    causes = defaultdict(list)
    for cell, step, why in diverged:
        causes[why].append(f"{cell} (step {step})")
    print(f"{len(diverged)} cells diverged")
    for why, cells in causes.items():
        print(f"  {len(cells)}: {why}: {', '.join(cells)}")


if __name__ == "__main__":
    main()
