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
    from ..core.config import load

    return load(args.config, _overrides(args.set))


def cmd_warmstart(args) -> int:
    from ..study.warmstart import warmstart

    cfg = _load(args)
    warmstart(cfg, args.model, Path(args.out) if args.out else None)
    return 0


def _via_server(args) -> int | None:
    """The job's exit status once the fork server at --server ran it, or None: run it here."""
    if not args.server:
        return None
    from .server import run_via_server

    return run_via_server(args.server, _without_server(args.argv))


def cmd_train(args) -> int:
    status = _via_server(args)
    if status is not None:
        return status
    from ..core.config import load
    from ..core.tracking import from_env
    from ..study.celldir import run_cell

    # the workflow hands its jobs the study's tracking section in the environment: no part of the
    # job's config file, whose changes rerun the cell
    section = from_env()
    cfg = load(args.config, {**({"tracking": section} if section else {}), **_overrides(args.set)})
    summary = run_cell(cfg, args.model, args.sampler, args.correction, args.seed, Path(args.out), model_dir=args.model_dir,
                       keep_checkpoint=args.keep_checkpoint, shared_rollouts=Path(args.rollouts) if args.rollouts else None,
                       initial_eval=Path(args.initial) if args.initial else None)
    print(json.dumps(summary, indent=1))
    return 0


def _shared_file(args, write) -> int:
    """A file the cells of a seed share (the rollouts, θ_0's evaluation), through the fork server
    where one runs: `write(cfg, model_dir)` with the job's config and its model's weights (torch is
    imported inside `write`, never where the server runs the job)."""
    status = _via_server(args)
    if status is not None:
        return status
    from ..study.celldir import cell_model_dir

    cfg = _load(args)
    write(cfg, cell_model_dir(cfg, args.model, args.model_dir))
    return 0


def cmd_rollouts(args) -> int:
    def write(cfg, model_dir):
        from ..study.rollouts import write_rollouts

        write_rollouts(cfg, args.model, args.sampler, args.seed, Path(args.out), model_dir, args.topk)

    return _shared_file(args, write)


def cmd_initial_eval(args) -> int:
    def write(cfg, model_dir):
        from ..study.initial_eval import write_initial_eval

        write_initial_eval(cfg, args.model, args.seed, Path(args.out), model_dir)

    return _shared_file(args, write)


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
    from ..study.probe import sample_report

    cfg = _load(args)
    rows = sample_report(cfg, args.model, args.prompts, args.n, args.seed, model_dir=args.model_dir)
    print(json.dumps(rows, indent=1))
    return 0


def cmd_collect(args) -> int:
    from ..report.analysis import collect
    from ..core.util import atomic_save

    steps, runs = collect(args.summaries, rerun=os.environ.get("DLCREPRO_RERUN_COMMAND"))
    atomic_save(Path(args.out_steps), lambda tmp: steps.to_parquet(tmp, index=False))
    atomic_save(Path(args.out_runs), lambda tmp: runs.to_parquet(tmp, index=False))
    return 0


def cmd_tables(args) -> int:
    import pandas as pd

    from ..report.tables import other_machine_findings, redraw_tex, write_all

    if args.redraw_tex:
        for f in redraw_tex(Path(args.redraw_tex)):
            print(f"rewrote {f}")
        return 0
    if not (args.steps and args.runs):
        raise SystemExit("tables: give --steps and --runs (or --redraw-tex DIR)")

    replicates = [[int(x) for x in g.split(",")] for g in args.replicates or []]
    others = other_machine_findings(args.other_machines or [], args.n_boot)
    write_all(pd.read_parquet(args.steps), pd.read_parquet(args.runs), Path(args.out), n_boot=args.n_boot, replicates=replicates,
              other_machines=others)
    return 0


def cmd_findings(args) -> int:
    """findings.{csv,md,tex} rebuilt from the findings input the tables job wrote into --from (and what
    other CPU kinds gave: --other-machines, by default those committed under <from>/other_machines/)."""
    from ..report.outputs import other_machine_files
    from ..report.tables import caption, findings_from, other_machine_findings, write_table

    source = Path(args.source)
    paths = args.other_machines if args.other_machines is not None else other_machine_files(source)
    table = findings_from(source, other_machine_findings(paths, args.n_boot), args.n_boot)
    out = Path(args.out) if args.out else source
    out.mkdir(parents=True, exist_ok=True)
    write_table(table, out, "findings", caption("findings", table))
    print(f"wrote {out / 'findings.csv'} (.md, .tex) from {source}")
    return 0


def cmd_look(args) -> int:
    """One look of `snakemake decide`: the findings of the look's runs, pooled, and the next batch."""
    import pandas as pd

    from ..study.decide import Design, findings_of_look, next_look, pooled_verdicts
    from ..core.util import atomic_write_text

    design = json.loads(Path(args.design).read_text())
    previous = json.loads(Path(args.previous).read_text()) if args.previous else None
    runs = pd.read_parquet(args.runs)
    table = findings_of_look(pd.read_parquet(args.steps), runs, Design(**design["design"]))
    cells = [f"{r.model}/{r.sampler}/{r.correction}/seed{r.seed}" for r in runs.itertuples()]
    record = next_look(pooled_verdicts(table), design, args.look, cells, previous)
    out = Path(args.out)
    atomic_write_text(out.with_suffix(".csv"), table.to_csv(index=False))
    atomic_write_text(out, json.dumps(record, indent=1) + "\n")
    print(f"look {args.look}: {record['seeds']} seeds, {len(record['cells'])} cells read; open: "
          f"{', '.join(record['open']) or 'none'}; next: {len(record['next']['cells'])} cells ({record['next']['why']})")
    return 0


def cmd_decide_summary(args) -> int:
    from ..study.decide import summary_markdown
    from ..core.util import atomic_write_text

    looks = sorted((json.loads(Path(p).read_text()) for p in args.looks), key=lambda x: x["look"])
    atomic_write_text(Path(args.out), summary_markdown(looks))
    return 0


def cmd_docs(args) -> int:
    from ..report.findings_docs import update

    root = Path(args.root)
    for page in update(root, Path(args.findings) if args.findings else root / "paper_tables" / "findings.csv"):
        print(f"rewrote {page}")
    return 0


def cmd_reproduce(args) -> int:
    from ..report.reproduce import write_report

    r = write_report(args.run, args.committed, args.out, args.figure_dir, args.n_boot)
    print(f"{r.headline}\nreport: {args.out}")
    return 0


def cmd_publish(args) -> int:
    from ..report.publish import publish

    try:
        written = publish(args.tables, args.figures, args.to_tables, args.to_figures)
    except (ValueError, FileNotFoundError) as e:
        print(e, file=sys.stderr)
        return 2
    print(f"published {len(written)} files into {args.to_tables} and {args.to_figures}; "
          "`python -m dlcrepro docs` rewrites the README's findings from them")
    return 0


def cmd_figures(args) -> int:
    import pandas as pd

    from ..report.figures import write_all

    findings = pd.read_csv(args.findings, dtype={"rules": str, "machine": str}) if args.findings else None
    write_all(pd.read_parquet(args.steps), Path(args.out), pd.read_parquet(args.runs), findings)
    return 0


def cmd_scan(args) -> int:
    from ..study.scan import read_raw, run_scan, write_report

    if args.redraw:
        tables_out, figures_out = args.tables_out or args.out, args.figures_out or args.out
        if not (tables_out and figures_out):
            raise SystemExit("scan --redraw: give --out (or --tables-out and --figures-out)")
        write_report(read_raw(args.redraw), Path(tables_out), Path(figures_out), args.name, args.n_boot,
                     args.paper_response_tokens)
        return 0
    missing = [f for f, v in (("--sampler", args.sampler), ("--corrections", args.corrections), ("--out", args.out)) if not v]
    if missing:
        raise SystemExit(f"scan: {', '.join(missing)} required (unless --redraw)")
    cfg = _load(args)
    raw = run_scan(cfg, args.model, args.sampler, args.corrections, args.prompts, args.reps, Path(args.out), seed=args.seed,
                   model_dir=args.model_dir, checkpoint=args.checkpoint, n_boot=args.n_boot,
                   response_tokens=args.paper_response_tokens, name=args.name)
    print(raw.groupby(["correction", "prompts"])[["tokens", "dev", "floor"]].sum().to_string())
    return 0


def cmd_plan(args) -> int:
    from ..cluster import CalibrationError, load_merged, missing_message, plan_text

    cfg = load_merged(args.config, _overrides(args.set))
    if args.calibrate:
        calibrate_plan(cfg, Path(args.calibrate), args.projection_error)
        print()
    try:
        print(plan_text(cfg, " ".join(args.config)))
    except CalibrationError as e:  # a calibration file of another config under results_dir
        raise SystemExit(f"plan: {e}") from None
    print("\n".join(decide_plan_lines(cfg, args.decide_findings)))
    return 1 if missing_message(cfg) else 0


def decide_plan_lines(cfg, source: str | None) -> list[str]:
    """The plan's section on `snakemake decide`: at the cap, and expected from a study's findings input
    (--decide-findings DIR; by default the first that holds one of the config's committed study, its
    tables_dir, and the tiny study's committed tables, paper_tables: the only spreads measured so far)."""
    from ..study.decide import expected_from, plan_lines
    from ..report.outputs import FINDINGS_INPUT

    candidates = [source] if source else [d for d in (cfg.committed_tables_dir, cfg.tables_dir, "paper_tables") if d]
    found = [Path(d) for d in candidates if all((Path(d) / f).exists() for f in FINDINGS_INPUT)]
    if source is None and not found:
        return plan_lines(cfg)
    directory = found[0] if found else Path(source)
    return plan_lines(cfg, expected_from(directory), f"the verdicts and spreads of {directory}'s findings input, pooled")


def calibrate_plan(cfg, results: Path, earlier: str | None) -> None:
    """`plan --calibrate RESULTS`: the calibrated plan from what ran under RESULTS, written to
    RESULTS/_calibration.json; with --projection-error, first how far an earlier calibration's
    projections were from the jobs that have run since."""
    from ..cluster import (calibration, calibration_path, calibration_text, measurements, project, projection_error_totals,
                          projection_errors)
    from ..core.util import atomic_write_text

    if not results.is_dir():
        raise SystemExit(f"plan --calibrate {results}: no such directory (the results_dir of a run: the pilot's or the grid's)")
    measured = measurements(cfg, results)
    if not measured:
        raise SystemExit(f"plan --calibrate {results}: no finished job of {cfg.name!r}'s grid or pilot there; run the pilot "
                         f"first: snakemake --configfile <config> pilot")
    if earlier:
        errors = projection_errors(json.loads(Path(earlier).read_text()), measured)
        if not errors:
            raise SystemExit(f"--projection-error {earlier}: none of its projected jobs has run under {results}")
        print(f"projection error of {earlier} (projected / measured - 1), per job; a trained cell's also on its work, start-up "
              "apart:")
        for e in errors:
            work = "" if e["work_error"] is None else f"  work {e['work_error']:+7.1%}  ({e['process']})"
            print(f"  {e['job']:<60} {e['projected_min']:7.2f} min projected {e['measured_min']:7.2f} measured "
                  f"{e['error']:+7.1%}{work}")
        t = projection_error_totals(errors)
        if t:
            print(f"total cell-time of {t['cells']} trained cells: {t['projected_min']:.2f} min projected, "
                  f"{t['measured_min']:.2f} measured "
                  f"({t['total']:+.1%}); largest cell error {t['worst']['error']:+.1%} ({t['worst']['job']})")
            if t["work_total"] is not None:
                print(f"  on work, start-up apart ({t['work_cells']} cells): total {t['work_total']:+.1%}; largest cell error "
                      f"{t['worst_work']['work_error']:+.1%} ({t['worst_work']['job']})")
        print()
    path = calibration_path(cfg, results)
    atomic_write_text(path, json.dumps(calibration(cfg, project(cfg, measured), str(results)), indent=1) + "\n")
    print(calibration_text(cfg, project(cfg, measured), path))
    if results.resolve() != Path(cfg.results_dir).resolve():
        print(f"note: the workflow reads {calibration_path(cfg, cfg.results_dir)} (results_dir); this one is under {results}")


def cmd_rehearsal(args) -> int:
    from ..study.rehearsal import build
    from ..core.util import atomic_write_text

    summary = build(Path(args.cache) if args.cache else None, warmstart_steps=args.warmstart_steps)
    text = json.dumps(summary, indent=1)
    if args.summary:
        atomic_write_text(Path(args.summary), text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlcrepro", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    def server_option(sp):
        sp.add_argument(
            "--server",
            metavar="SOCKET",
            default=os.environ.get("DLCREPRO_SERVER") or None,
            help="run as a child of the fork server at SOCKET if one answers there, outside Slurm (default: $DLCREPRO_SERVER)",
        )

    def common(sp):
        sp.add_argument("--config", default="configs/tiny.yaml", help="YAML config file")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (dotted), e.g. train.lr=0.1")
        sp.add_argument("--model", default="tiny", help="model name (a key of `models`)")

    w = sub.add_parser("warmstart", help="supervised warm start of a tiny model; saves it and its greedy test accuracy")
    common(w)
    w.add_argument("--out", help="output directory (default <artifacts>/<model>)")
    w.set_defaults(fn=cmd_warmstart)

    rh = sub.add_parser("rehearsal", help="make the rehearsal's Qwen3 checkpoint and Countdown data set in the Hugging Face "
                        "cache, found by id as a downloaded one (configs/rehearsal.yaml)")
    rh.add_argument("--cache",
                    help="the hub cache to write into (default: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)")
    rh.add_argument("--warmstart-steps", type=int, help="shorten the warm start (tests); default: the recipe's")
    rh.add_argument("--summary", help="also write the summary (JSON) here")
    rh.set_defaults(fn=cmd_rehearsal)

    t = sub.add_parser("train", help="run one grid cell: model x sampler x correction x seed")
    common(t)
    t.add_argument("--sampler", required=True)
    t.add_argument("--correction", required=True)
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--out", required=True, help="the cell's result directory")
    t.add_argument("--model-dir", help="model weights directory (default from the config)")
    t.add_argument("--keep-checkpoint", action="store_true",
                   help="keep the final state as checkpoint.pt (θ_t and θ_s after the last step: an input for `scan "
                        "--checkpoint`)")
    t.add_argument("--rollouts", metavar="FILE",
                   help="the batches its sampler's cells share (`rollouts`): read while the engine holds θ_0, not sampled")
    t.add_argument("--initial", metavar="FILE",
                   help="its seed's θ_0 evaluation (`initial-eval`): θ_0's accuracies read, not measured again")
    server_option(t)
    t.set_defaults(fn=cmd_train)

    ie = sub.add_parser("initial-eval", help="evaluate θ_0 once for every cell of a seed (for `train --initial`)")
    common(ie)
    ie.add_argument("--seed", type=int, required=True)
    ie.add_argument("--out", required=True, help="the θ_0 evaluation file (JSON)")
    ie.add_argument("--model-dir", help="model weights directory (default from the config)")
    server_option(ie)
    ie.set_defaults(fn=cmd_initial_eval)

    ro = sub.add_parser("rollouts",
                        help="sample once the steps every cell of a lagged sampler samples from θ_0 (for `train --rollouts`)")
    common(ro)
    ro.add_argument("--sampler", required=True)
    ro.add_argument("--seed", type=int, required=True)
    ro.add_argument("--out", required=True, help="the rollouts file")
    ro.add_argument("--model-dir", help="model weights directory (default from the config)")
    ro.add_argument("--topk", type=int, default=0,
                    help="the engine's top-k log-probs kept (engine.topk where a correction reads them; 0: none)")
    server_option(ro)
    ro.set_defaults(fn=cmd_rollouts)

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
    tb.add_argument("--steps")
    tb.add_argument("--runs")
    tb.add_argument("--out", default="results/paper_tables")
    tb.add_argument("--redraw-tex", metavar="DIR",
                    help="only rewrite DIR's .tex tables from their .csv and .md caption (no numbers change)")
    tb.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the intervals")
    tb.add_argument("--replicates", nargs="*", metavar="SEEDS",
                    help="seed groups checked apart, e.g. 0,1,2 3,4,5 (default: all seeds, one group)")
    tb.add_argument("--other-machines", nargs="*", metavar="CSV",
                    help="findings.csv, or findings_steps.csv and findings_runs.csv, of the same grid from other CPU kinds "
                    "(seen on one kind only: 'seen on one machine')")
    tb.set_defaults(fn=cmd_tables)

    fi = sub.add_parser("findings", help="rebuild findings.csv (.md, .tex) from the findings input the tables job wrote "
                        "(findings_steps.csv, findings_runs.csv): every verdict from committed files")
    fi.add_argument("--from", dest="source", default="paper_tables", help="the tables directory holding the findings input")
    fi.add_argument("--out", help="where findings.csv goes (default: the --from directory)")
    fi.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples F13 starts from (as the tables job)")
    fi.add_argument("--other-machines", nargs="*", metavar="CSV",
                    help="other CPU kinds' findings.csv or findings input (default: those under <from>/other_machines/)")
    fi.set_defaults(fn=cmd_findings)

    lk = sub.add_parser("look", help="one look of `snakemake decide`: the pooled findings of the runs so far, and the cells "
                        "the next batch of seeds trains (dlcrepro/decide.py)")
    lk.add_argument("--steps", required=True, help="the look's steps.parquet (collect over its cells)")
    lk.add_argument("--runs", required=True, help="the look's runs.parquet")
    lk.add_argument("--design", required=True, help="the decide run's design.json (the workflow writes it)")
    lk.add_argument("--previous", help="the previous look's JSON (none at look 0)")
    lk.add_argument("--look", type=int, required=True, help="this look's index, 0 for grid.seeds")
    lk.add_argument("--out", required=True, help="the look's JSON; its findings table goes beside it as .csv")
    lk.set_defaults(fn=cmd_look)

    ds = sub.add_parser("decide-summary", help="the decide run's summary (markdown) from its looks' JSON files")
    ds.add_argument("--looks", nargs="+", required=True)
    ds.add_argument("--out", required=True)
    ds.set_defaults(fn=cmd_decide_summary)

    dc = sub.add_parser("docs", help="rewrite the README's and docs/results.md's findings count and table from findings.csv")
    dc.add_argument("--root", default=".", help="the repository (default: here)")
    dc.add_argument("--findings", help="the findings table (default: <root>/paper_tables/findings.csv)")
    dc.set_defaults(fn=cmd_docs)

    rp = sub.add_parser("reproduce", help="compare a run's findings input with the committed study's, cell by cell: "
                        "a markdown report, a figure, and its headline (the workflow's last rule)")
    rp.add_argument("--run", required=True, help="the run's tables directory (its findings_steps.csv, findings_runs.csv)")
    rp.add_argument("--committed", default="", help="the committed study's tables directory, whose other_machines/ "
                    "holds other CPU kinds' inputs (empty: none, said in the report)")
    rp.add_argument("--out", required=True, help="the markdown report")
    rp.add_argument("--figure-dir", required=True, help="where reproduce.png and .pdf go")
    rp.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of the verdicts (as the tables job)")
    rp.set_defaults(fn=cmd_reproduce)

    pb = sub.add_parser("publish", help="copy a finished run's tables, findings input and figures over the committed study "
                        "(the one command that writes paper_tables/ and figures/)")
    pb.add_argument("--tables", required=True, help="the run's tables directory")
    pb.add_argument("--figures", required=True, help="the run's figures directory")
    pb.add_argument("--to-tables", required=True, help="the committed tables directory (config committed_tables_dir)")
    pb.add_argument("--to-figures", required=True, help="the committed figures directory (config committed_figures_dir)")
    pb.set_defaults(fn=cmd_publish)

    fg = sub.add_parser("figures", help="write every figure (.pdf, .png)")
    fg.add_argument("--steps", required=True)
    fg.add_argument("--runs", required=True)
    fg.add_argument("--out", default="results/figures")
    fg.add_argument("--findings", help="the findings table (findings.csv): also draw the summary figure findings.png from it")
    fg.set_defaults(fn=cmd_figures)

    sc = sub.add_parser("scan", help="noise-floor multiple against batch size at a fixed θ (no update), with the fit M - 1 = b T")
    common(sc)
    sc.add_argument("--sampler", help="sampler name (required unless --redraw)")
    sc.add_argument("--corrections", nargs="+", help="correction names; they share each repetition's batches")
    sc.add_argument("--prompts", nargs="+", type=int, default=[8, 16, 32, 64],
                    help="the ladder: prompts per batch (responses per prompt: the config's)")
    sc.add_argument("--reps", type=int, default=8, help="repetitions per rung, each with fresh prompts and seeds")
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--out", help="directory of scan.parquet, the table and the figure")
    sc.add_argument("--model-dir", help="θ: model weights directory (default from the config; the run's θ_0 with --checkpoint)")
    sc.add_argument("--checkpoint", help="θ: a run's checkpoint.pt (its policy; its sampler state for lagged samplers)")
    sc.add_argument("--n-boot", type=int, default=2000, help="bootstrap resamples for the intervals")
    sc.add_argument("--paper-response-tokens", type=float,
                    help="mean response tokens of the paper's batch for T* (default: 300, an assumption)")
    sc.add_argument("--name", default="scaling", help="file stem of the table and the figure")
    sc.add_argument("--redraw", nargs="+", metavar="PARQUET",
                    help="no scan: write the table and figure from these scan.parquet files")
    sc.add_argument("--tables-out", help="with --redraw: where the table goes (default --out)")
    sc.add_argument("--figures-out", help="with --redraw: where the figure goes (default --out)")
    sc.set_defaults(fn=cmd_scan)

    pl = sub.add_parser("plan",
                        help="before submitting: cells trained and copied, GPU-hours requested and estimated, the largest job, "
                             "missing weights or data")
    pl.add_argument("--config", nargs="+", default=["configs/tiny.yaml"],
                    help="config files, merged in order (as snakemake --configfile)")
    pl.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (dotted)")
    pl.add_argument("--calibrate", metavar="RESULTS",
                    help="calibrate from the jobs that ran under RESULTS (the pilot's, the grid's): "
                    "project the rest, write RESULTS/_calibration.<config name>.json (the rules' requests then read it)")
    pl.add_argument("--projection-error", metavar="CALIBRATION", help="with --calibrate: first compare an earlier calibration "
                    "file's projections with the jobs that have run since")
    pl.add_argument("--decide-findings", metavar="DIR", help="price `snakemake decide` as expected from the findings input "
                    "(findings_steps.csv, findings_runs.csv) in DIR (default: the config's tables_dir where it holds one)")
    pl.set_defaults(fn=cmd_plan)

    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    from ..step.checkpoint import BadCheckpoint
    from ..core.config import ConfigError
    from ..core.registry import UnknownNameError
    from ..core.util import DamagedFileError, DiskFullError, NonFiniteError, disk_full

    # a user's mistake (a config value, an unknown name, a missing file) or a condition of the data or
    # the disk ends in one line; anything else is a bug and keeps its traceback
    try:
        return args.fn(args)
    except (ConfigError, UnknownNameError, FileNotFoundError, NonFiniteError, DiskFullError, DamagedFileError,
            BadCheckpoint) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk met outside the atomic writers (a log line, a library's cache)
        full = disk_full(e, Path(e.filename or "a file"))
        if full is None:
            raise
        print(f"error: {full}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
