"""Where one grid cell's time goes, by phase and by kernel: the torch profiler over a real cell.

    .venv/bin/python bench/cell_profile.py [--config configs/tiny.yaml] [--sampler stale]
        [--correction dlc] [--steps 10] [--threads 1] [--top 12]

Runs the cell twice in a temporary directory with the same seed: once plain (the phases' wall
seconds as the study sees them) and once under `torch.profiler` with FLOP counting. Each step's
phases are named in the profile (`PhaseTimer` wraps them in `record_function("phase:<name>")`), so
every operator is charged to the phase that ran it, engine (vLLM runs in this process) and trainer
alike. Per phase it prints:
  - wall seconds per step, plain and profiled;
  - the share of the profiled wall spent inside operators (self time of every op under the phase);
    the rest is Python, vLLM's scheduler and the profiler's own bookkeeping, so "outside ops" is an
    upper bound on the Python overhead;
  - the FLOPs the profiler counts (matrix products and element-wise adds/muls) and the rate
    achieved in the matrix-product kernels and over the whole phase.
Then the matrix-product shapes the trainer ran most, each re-timed alone in a loop in the same
process with the same threads: the machine's rate at exactly those shapes, against what the cell
got. Then the top operators of the trainer's phases by self time. A benchmark, not a test: it
asserts nothing. Needs a warm-started model (`python -m dlcrepro warmstart`, or the workflow's first
job).
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time
from pathlib import Path

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
TRAINER_PHASES = ("logprobs", "correction", "update")  # the phases only the trainer runs (the probe phase also samples)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/tiny.yaml")
    p.add_argument("--model", default="tiny")
    p.add_argument("--sampler", default="stale")
    p.add_argument("--correction", default="dlc")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a grid job gets one CPU)")
    p.add_argument("--top", type=int, default=12, help="operators and shapes listed")
    return p.parse_args()


def descendants(event):
    stack = list(event.cpu_children)
    while stack:
        e = stack.pop()
        yield e
        stack.extend(e.cpu_children)


def is_op(event) -> bool:
    """An operator (aten::mm, _C::..., vllm::...) rather than a record_function annotation."""
    return "::" in event.name and not event.name.startswith("phase:")


def phase_table(events) -> dict[str, dict]:
    """Per phase, summed over its occurrences: profiled wall µs, self µs inside ops, FLOPs, and the
    matrix products' FLOPs and self µs."""
    out = collections.defaultdict(lambda: collections.Counter())
    for ev in events:
        if not ev.name.startswith("phase:"):
            continue
        c = out[ev.name.removeprefix("phase:")]
        c["wall_us"] += ev.cpu_time_total
        for d in descendants(ev):
            if not is_op(d):
                continue
            c["op_self_us"] += d.self_cpu_time_total
            c["flops"] += d.flops or 0
            if d.name in MATMUL_OPS:
                c["mm_flops"] += d.flops or 0
                c["mm_self_us"] += d.self_cpu_time_total
    return out


def trainer_ops(events):
    """Every operator charged to a trainer phase."""
    for ev in events:
        if ev.name.startswith("phase:") and ev.name.removeprefix("phase:") in TRAINER_PHASES:
            yield from (d for d in descendants(ev) if is_op(d))


def mm_rate(torch, name: str, shapes: list, seconds: float = 0.3) -> float:
    """GFLOP/s of one matrix product at these input shapes, timed alone in a loop."""
    args = [torch.randn(s) if s else None for s in shapes]
    if name == "aten::mm":
        a, b = args[:2]
        fn, flops = (lambda: torch.mm(a, b)), 2 * a.shape[0] * a.shape[1] * b.shape[1]
    elif name == "aten::addmm":
        c, a, b = args[:3]
        fn, flops = (lambda: torch.addmm(c, a, b)), 2 * a.shape[0] * a.shape[1] * b.shape[1]
    elif name == "aten::bmm":
        a, b = args[:2]
        fn, flops = (lambda: torch.bmm(a, b)), 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
    else:
        return float("nan")
    for _ in range(3):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return flops * n / (time.perf_counter() - t0) / 1e9


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import pandas as pd
    import torch
    from torch.profiler import ProfilerActivity, profile

    from dlcrepro.core import config as config_mod
    from dlcrepro.core.paths import model_dir
    from dlcrepro.study.celldir import run_cell
    from dlcrepro.step.train import PHASES

    torch.set_num_threads(args.threads)
    cfg = config_mod.load(args.config, {"train.steps": args.steps})
    mdir = model_dir(cfg, args.model)
    if not (mdir / "config.json").exists():
        raise SystemExit(f"no model at {mdir}: run `python -m dlcrepro warmstart --config {args.config}` first")
    cell = f"{args.model}/{args.sampler}/{args.correction}/seed{args.seed}"
    print(f"one cell: {cell}, {args.steps} steps, {args.threads} torch thread(s), torch {torch.__version__}")

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        run_cell(cfg, args.model, args.sampler, args.correction, args.seed, Path(tmp) / "plain")
        plain_wall = time.perf_counter() - t
        plain = pd.read_parquet(Path(tmp) / "plain" / "metrics.parquet")
        t = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
            run_cell(cfg, args.model, args.sampler, args.correction, args.seed, Path(tmp) / "profiled")
        profiled_wall = time.perf_counter() - t
        same = pd.read_parquet(Path(tmp) / "profiled" / "metrics.parquet")
    numbers = [c for c in plain.columns if not c.startswith("sec_")]
    print(f"cell wall: {plain_wall:.1f} s plain, {profiled_wall:.1f} s profiled; "
          f"the two runs' non-timing columns {'equal' if plain[numbers].equals(same[numbers]) else 'DIFFER'}")

    events = prof.events()
    phases = phase_table(events)
    steps = args.steps
    print("\nper phase, per step (plain wall; profiled: wall, share inside ops, GFLOP, GFLOP/s in matrix products, over the "
          "phase)")
    print(f"  {'phase':<11s} {'plain s':>8s} {'prof. s':>8s} {'in ops':>7s} {'GFLOP':>8s} {'mm GF/s':>8s} {'phase GF/s':>10s}")
    total = collections.Counter()
    for ph in PHASES:
        c = phases.get(ph, collections.Counter())
        total.update(c)
        plain_s = plain[f"sec_{ph}"].mean()
        wall = c["wall_us"] / 1e6 / steps
        share = c["op_self_us"] / c["wall_us"] if c["wall_us"] else float("nan")
        mm_rate_ = c["mm_flops"] / c["mm_self_us"] / 1e3 if c["mm_self_us"] else float("nan")
        phase_rate = c["flops"] / c["wall_us"] / 1e3 if c["wall_us"] else float("nan")
        print(f"  {ph:<11s} {plain_s:8.3f} {wall:8.3f} {share:7.0%} {c['flops'] / 1e9 / steps:8.3f} {mm_rate_:8.1f} "
              f"{phase_rate:10.1f}")
    print(f"  {'all':<11s} {plain[[f'sec_{p}' for p in PHASES]].sum(axis=1).mean():8.3f} {total['wall_us'] / 1e6 / steps:8.3f} "
          f"{total['op_self_us'] / total['wall_us']:7.0%} {total['flops'] / 1e9 / steps:8.3f} "
          f"{total['mm_flops'] / total['mm_self_us'] / 1e3:8.1f} {total['flops'] / total['wall_us'] / 1e3:10.1f}")

    ops = list(trainer_ops(events))
    by_shape = collections.defaultdict(lambda: [0.0, 0, 0])  # (name, shapes) -> self µs, FLOPs, calls
    for e in ops:
        if e.name in MATMUL_OPS:
            k = (e.name, tuple(tuple(s) for s in e.input_shapes))
            by_shape[k][0] += e.self_cpu_time_total
            by_shape[k][1] += e.flops or 0
            by_shape[k][2] += 1
    trainer_mm_us = sum(v[0] for v in by_shape.values())
    print(f"\nthe trainer's matrix products by shape ({len(by_shape)} shapes, {trainer_mm_us / 1e6 / steps:.3f} s per step): "
          "the cell's rate against the same product timed alone")
    print(f"  {'op':<12s} {'shapes':<42s} {'calls':>6s} {'share':>6s} {'cell GF/s':>9s} {'alone GF/s':>10s}")
    for (name, shapes), (us, flops, calls) in sorted(by_shape.items(), key=lambda kv: -kv[1][0])[: args.top]:
        alone = mm_rate(torch, name, [list(s) for s in shapes])
        print(f"  {name:<12s} {str([list(s) for s in shapes if s])[:42]:<42s} {calls:6d} {us / trainer_mm_us:6.1%} "
              f"{flops / us / 1e3 if us else float('nan'):9.1f} {alone:10.1f}")
    square = mm_rate(torch, "aten::mm", [[1024, 1024], [1024, 1024]], seconds=1.0)
    print(f"  a 1024 x 1024 x 1024 product alone: {square:.1f} GFLOP/s ({args.threads} thread(s), float32)")

    self_by_op = collections.defaultdict(lambda: [0.0, 0])
    for e in ops:
        self_by_op[e.name][0] += e.self_cpu_time_total
        self_by_op[e.name][1] += 1
    trainer_wall = sum(phases[p]["wall_us"] for p in TRAINER_PHASES if p in phases)
    print(f"\nthe trainer's phases' top operators by self time ({trainer_wall / 1e6 / steps:.3f} s per step profiled)")
    for name, (us, calls) in sorted(self_by_op.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {name:<40s} {us / 1e6 / steps:8.4f} s/step {us / trainer_wall:6.1%} {calls // steps:6d} calls/step")


if __name__ == "__main__":
    main()
