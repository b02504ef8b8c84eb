"""What the frameworks' mismatch metrics (issue #68: `diagnostics.mismatch_parts`, field_metrics three
times) cost a step, beside the mismatch columns the step already had (`diagnostics.mismatch_metrics`).

    .venv/bin/python bench/field_metrics_cost.py [--config configs/tiny.yaml] [--reps 200]
        [--cells BEFORE/results AFTER/results]

(1) On a batch of the config's size (prompts_per_step × responses_per_prompt responses of
engine.max_tokens / 2 tokens each, log-probs drawn near the tiny study's: δ ~ 0.01, λ ~ 0.3 nats),
the median seconds of each over `--reps` calls, in the step's own thread settings. (2) With
`--cells`: the cells both study directories hold, their median `sec_logprobs` (the phase that
computes them) and wall seconds per step, before and after. Prints a table; a benchmark, not a
test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dlcrepro.core.config import load  # noqa: E402
from dlcrepro.step.diagnostics import mismatch_metrics, mismatch_parts  # noqa: E402


def batch(responses: int, length: int, seed: int = 0):
    """e, a, b `(N,)` and each token's response: a of the engine's e give or take 0.01 nats, b of a 0.3."""
    g = torch.Generator().manual_seed(seed)
    n = responses * length
    e = -torch.rand(n, generator=g) * 3
    a = e + 0.01 * torch.randn(n, generator=g)
    b = a + 0.3 * torch.randn(n, generator=g)
    return e, a, b, torch.arange(responses).repeat_interleave(length)


def median_seconds(fn, reps: int) -> float:
    fn()  # warm
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def step_seconds(before: Path, after: Path) -> None:
    for m in sorted(after.glob("*/*/*/seed*/metrics.parquet")):
        rel = m.relative_to(after)
        if not (before / rel).exists():
            continue
        a, b = pd.read_parquet(before / rel), pd.read_parquet(m)
        sec = [c for c in a if c.startswith("sec_")]
        ms = lambda x: x.median() * 1e3  # noqa: E731
        print(f"{rel.parent}: sec_logprobs median {ms(a['sec_logprobs']):.2f} -> {ms(b['sec_logprobs']):.2f} ms; "
              f"a step (sum of sec_*) median {ms(a[sec].sum(axis=1)):.0f} -> {ms(b[sec].sum(axis=1)):.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--cells", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = p.parse_args()
    cfg = load(args.config)
    tcfg = cfg.train_for(cfg.grid.models[0])
    responses, length = tcfg.prompts_per_step * tcfg.responses_per_prompt, max(cfg.engine.max_tokens // 2, 1)
    e, a, b, seq = batch(responses, length)
    old = median_seconds(lambda: mismatch_metrics(e, a, b, seq, responses), args.reps)
    new = median_seconds(lambda: mismatch_parts(e, a, b, seq, responses), args.reps)
    print(f"{args.config}: {responses} responses x {length} tokens, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"mismatch_metrics (the existing columns): {old * 1e3:.3f} ms median of {args.reps}")
    print(f"mismatch_parts (45 new columns):         {new * 1e3:.3f} ms median of {args.reps} ({new / old:.1f}x)")
    if args.cells:
        step_seconds(*args.cells)


if __name__ == "__main__":
    main()
