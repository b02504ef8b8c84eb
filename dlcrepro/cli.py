"""`python -m dlcrepro <command>`: the package's command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise SystemExit(f"--set expects KEY=VALUE, got {pair!r}")
        k, v = pair.split("=", 1)
        out[k] = yaml.safe_load(v)
    return out


def _load(args):
    from .config import load

    return load(args.config, _overrides(args.set))


def cmd_warmstart(args) -> int:
    from .warmstart import warmstart

    cfg = _load(args)
    warmstart(cfg, args.model, Path(args.out) if args.out else None)
    return 0


def cmd_train(args) -> int:
    if args.server:
        from .server import run_via_server

        status = run_via_server(args.server, _without_server(args.argv))
        if status is not None:
            return status
    from .train import run_cell

    cfg = _load(args)
    summary = run_cell(cfg, args.model, args.sampler, args.correction, args.seed, Path(args.out), model_dir=args.model_dir)
    print(json.dumps(summary, indent=1))
    return 0


def _without_server(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--server":
            skip = True
        elif not a.startswith("--server="):
            out.append(a)
    return out


def cmd_serve(args) -> int:
    from .server import default_socket, serve

    serve(args.socket or default_socket(Path.cwd(), sys.executable), args.watch_pid, args.idle)
    return 0


def cmd_sample(args) -> int:
    from .probe import sample_report

    cfg = _load(args)
    rows = sample_report(cfg, args.model, args.prompts, args.n, args.seed, model_dir=args.model_dir)
    print(json.dumps(rows, indent=1))
    return 0


def cmd_collect(args) -> int:
    from .analysis import collect
    from .util import atomic_save

    steps, runs = collect(args.summaries)
    atomic_save(Path(args.out_steps), lambda tmp: steps.to_parquet(tmp, index=False))
    atomic_save(Path(args.out_runs), lambda tmp: runs.to_parquet(tmp, index=False))
    return 0


def cmd_tables(args) -> int:
    import pandas as pd

    from .tables import write_all

    replicates = [[int(x) for x in g.split(",")] for g in args.replicates or []]
    write_all(pd.read_parquet(args.steps), pd.read_parquet(args.runs), Path(args.out), n_boot=args.n_boot, replicates=replicates)
    return 0


def cmd_figures(args) -> int:
    import pandas as pd

    from .figures import write_all

    write_all(pd.read_parquet(args.steps), Path(args.out), pd.read_parquet(args.runs))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlcrepro", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("--config", default="configs/tiny.yaml", help="YAML config file")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (dotted), e.g. train.lr=0.1")
        sp.add_argument("--model", default="tiny", help="model name (a key of `models`)")

    w = sub.add_parser("warmstart", help="supervised warm start of a tiny model; saves it and its greedy test accuracy")
    common(w)
    w.add_argument("--out", help="output directory (default <artifacts>/<model>)")
    w.set_defaults(fn=cmd_warmstart)

    t = sub.add_parser("train", help="run one grid cell: model x sampler x correction x seed")
    common(t)
    t.add_argument("--sampler", required=True)
    t.add_argument("--correction", required=True)
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--out", required=True, help="the cell's result directory")
    t.add_argument("--model-dir", help="model weights directory (default from the config)")
    t.add_argument(
        "--server",
        metavar="SOCKET",
        default=os.environ.get("DLCREPRO_SERVER") or None,
        help="run as a child of the fork server at SOCKET if one answers there, outside Slurm (default: $DLCREPRO_SERVER)",
    )
    t.set_defaults(fn=cmd_train)

    sv = sub.add_parser("serve", help="fork server: import torch and vLLM once, fork a child per `train --server` job")
    sv.add_argument("--socket", help="Unix socket path (default: per working directory and python, under the temp dir)")
    sv.add_argument("--watch-pid", type=int, help="stop when this process (e.g. snakemake) is gone")
    sv.add_argument("--idle", type=float, help="stop after this many seconds without a job")
    sv.set_defaults(fn=cmd_serve)

    s = sub.add_parser("sample", help="sample a batch from each of the four samplers and report mean |discrepancy|")
    common(s)
    s.add_argument("--prompts", type=int, default=16)
    s.add_argument("--n", type=int, default=8)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--model-dir", help="model weights directory (default from the config)")
    s.set_defaults(fn=cmd_sample)

    c = sub.add_parser("collect", help="gather every run's metrics and summary into two tables")
    c.add_argument("summaries", nargs="+", help="summary.json files (metrics.parquet beside each)")
    c.add_argument("--out-steps", required=True)
    c.add_argument("--out-runs", required=True)
    c.set_defaults(fn=cmd_collect)

    tb = sub.add_parser("tables", help="write every paper table (.tex, .md, .csv)")
    tb.add_argument("--steps", required=True)
    tb.add_argument("--runs", required=True)
    tb.add_argument("--out", default="paper_tables")
    tb.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the intervals")
    tb.add_argument("--replicates", nargs="*", metavar="SEEDS", help="seed groups checked apart, e.g. 0,1,2 3,4,5 (default: all seeds, one group)")
    tb.set_defaults(fn=cmd_tables)

    fg = sub.add_parser("figures", help="write every figure (.pdf, .png)")
    fg.add_argument("--steps", required=True)
    fg.add_argument("--runs", required=True)
    fg.add_argument("--out", default="figures")
    fg.set_defaults(fn=cmd_figures)

    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    from .config import ConfigError

    try:
        return args.fn(args)
    except (ConfigError, KeyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
