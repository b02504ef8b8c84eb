# Helpers of the workflow: config validation, the grid table, paths, the fork server. No rule lives here.
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate
from snakemake_interface_executor_plugins.settings import DeploymentMethod

# The package's torch-free modules, from this checkout (the Snakemake env need not have it installed).
sys.path.insert(0, str(Path(workflow.basedir).resolve()))
from dlcrepro import cluster
from dlcrepro.study import decide, jobconfig
from dlcrepro.report import outputs
from dlcrepro.core import procs, tracking
from dlcrepro.core.config import ConfigError
from dlcrepro.core.config import build as build_config
from dlcrepro.core.config import tracking_for_jobs
from dlcrepro.core.config import with_base
from dlcrepro.core.grid import get_sampler
from dlcrepro.core.util import write_text_if_changed
from dlcrepro.core.paths import BUILT_HERE, REHEARSAL_DATASET, REHEARSAL_MODEL, cache_repo_dir, hf_hub_cache

# An overlay (`base: configs/tiny.yaml`, as configs/zoo.yaml) stands on its own: laid over its base
# here, the key gone, so the jobs' configs are those of the merged file.
if "base" in config:
    _merged = with_base(config)
    config.clear()
    config.update(_merged)
validate(config, schema="../schemas/config.schema.yaml")

CFG = build_config(config)

RESULTS = config.get("results_dir", "results")
# This run's tables and figures: under RESULTS unless the config says where, never the committed
# study's (a run changes no tracked file). The committed study this config reproduces, compared with
# at the end (by `reproduce`) and overwritten only by `snakemake publish`; "" where it has none.
FIGURES = config.get("figures_dir") or f"{RESULTS}/figures"
TABLES = config.get("tables_dir") or f"{RESULTS}/paper_tables"
COMMITTED_TABLES = config.get("committed_tables_dir", "")
COMMITTED_FIGURES = config.get("committed_figures_dir", "")
ARTIFACTS = config.get("artifacts", "artifacts")
AGG = f"{RESULTS}/_aggregate"
LOGS = f"{RESULTS}/_logs"
BENCHMARKS = f"{RESULTS}/_benchmarks"  # Snakemake's per-job max RSS and CPU time
HF_CACHE = hf_hub_cache().resolve()  # where hf models and parquet data are found by id (never downloaded)

# config `tracking`: training jobs find the study's section, its directories resolved under
# RESULTS, in their environment (as they find the fork server), not in their config file, a rule
# param or shell text, whose changes would rerun every cell (dlcrepro/core/tracking.py, config.tracking_for_jobs).
_TRACKING = tracking_for_jobs(config.get("tracking"), RESULTS, config.get("name", "tiny"))
if _TRACKING:
    os.environ[tracking.ENV] = _TRACKING
else:
    os.environ.pop(tracking.ENV, None)


def _python():
    """The python of jobs: config `python`; the env's under --sdm conda; the repo's .venv (made by
    scripts/setup.sh) when snakemake runs from another env; else snakemake's own."""
    if config.get("python"):
        return config["python"]
    if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
        return "python"
    if Path(".venv/bin/python").exists():
        return ".venv/bin/python"
    return sys.executable


PYTHON = _python()
TRAIN_ENV = f"../../{config.get('train_env', 'envs/train-cpu.yaml')}"  # rule files sit two levels down
ANALYSIS_ENV = "../../envs/analysis.yaml"


def grid_cells():
    """The grid as a list of dicts, exclusions removed (the grid is data, not code: dlcrepro/cluster/cells.py)."""
    return [dict(model=c.model, sampler=c.sampler, correction=c.correction, seed=c.seed) for c in cluster.grid_cells(CFG)]


CELLS = grid_cells()
CELL_KEYS = {(c["model"], c["sampler"], c["correction"], c["seed"]) for c in CELLS}
# `snakemake decide` trains cells of seeds past grid.seeds (decide.cap_seeds): such a cell is the cell
# the grid would have with that seed, so its copy source and its rollouts' top-k are read from the
# grid widened to those seeds (dlcrepro/study/decide.py); for grid.seeds it is the grid itself.
DECIDE_CFG = decide.widened(CFG)
DECIDE_SEEDS = DECIDE_CFG.grid.seeds
WIDE_KEYS = {(c.model, c.sampler, c.correction, c.seed) for c in cluster.grid_cells(DECIDE_CFG)}


def same_cell(wildcards):
    """The grid cell whose run this cell's run is bit for bit (dlcrepro/core/grid.py), or None. Such a
    cell waits for that one and copies its metrics instead of training; a cell it would equal but
    that the grid leaves out is no help, and the cell trains."""
    w = wildcards
    same = cluster.copy_source(CFG, w.model, w.sampler, w.correction, int(w.seed), WIDE_KEYS)
    return (w.model, w.sampler, same, int(w.seed)) if same else None


def same_cell_input(wildcards):
    key = same_cell(wildcards)
    return [f"{cell_dir(*key)}/summary.json"] if key else []


def rollouts_file(model, sampler, seed):
    return f"{RESULTS}/_rollouts/{model}/{sampler}/seed{seed}.pt"


def shares_rollouts(model, sampler):
    """Whether the cells of this sampler share their first steps' batches (dlcrepro/study/rollouts.py)."""
    t = CFG.train_for(model)
    return get_sampler(sampler).shared_steps(t.steps, t.sync_every) > 0


def rollouts_input(wildcards):
    """The shared rollouts a training cell reads; none for a sampler synced before every step, or
    for a cell that copies another's run."""
    w = wildcards
    if same_cell(w) is not None or not shares_rollouts(w.model, w.sampler):
        return []
    return [rollouts_file(w.model, w.sampler, w.seed)]


def rollouts_arg(wildcards, input):
    return f"--rollouts {input.rollouts}" if input.rollouts else ""


def initial_eval_file(model, seed):
    return f"{RESULTS}/_initial/{model}/seed{seed}.json"


def initial_eval_input(wildcards):
    """θ_0's evaluation a training cell reads (dlcrepro/study/initial_eval.py); none for a cell that copies
    another's run."""
    w = wildcards
    return [] if same_cell(w) is not None else [initial_eval_file(w.model, w.seed)]


def initial_eval_arg(wildcards, input):
    return f"--initial {input.initial}" if input.initial else ""


def rollouts_topk(wildcards):
    """The top-k log-probs a rollouts job keeps (cluster.rollouts_topk)."""
    w = wildcards
    return cluster.rollouts_topk(DECIDE_CFG, w.model, w.sampler, w.seed)


def _alternatives(values):
    return "|".join(sorted(str(v) for v in set(values)))


wildcard_constraints:
    model=_alternatives(config["grid"]["models"]),
    sampler=_alternatives(config["grid"]["samplers"]),
    correction=_alternatives(config["grid"]["corrections"]),
    seed=_alternatives(DECIDE_SEEDS),  # grid.seeds, then the decide run's (decide.seed_order)


def replicate_args():
    """`--replicates 0,1,2 3,4,5` for the tables job: the seed groups whose findings are checked apart."""
    groups = config["grid"].get("replicates") or []
    return ("--replicates " + " ".join(",".join(map(str, g)) for g in groups)) if groups else ""


def cell_dir(model, sampler, correction, seed):
    return f"{RESULTS}/{model}/{sampler}/{correction}/seed{seed}"


def output_parent(wildcards, output):
    """The directory of a rule's last output (a cell's dir, the tables' or figures' dir)."""
    return str(Path(output[-1]).parent)


def input_parent(wildcards, input):
    """The directory of a rule's first input (the run's tables for `reproduce` and `publish`)."""
    return str(Path(input[0]).parent)


def last_input_parent(wildcards, input):
    """The directory of a rule's last input (the run's figures for `publish`)."""
    return str(Path(input[-1]).parent)


def cell_outputs(name):
    return [str(Path(cell_dir(**c), name)) for c in CELLS]


def job_config_path(model, job):
    """The file with exactly what `job` (warmstart, train) of the model depends on
    (dlcrepro/study/jobconfig.py), rewritten only when that changes."""
    path = jobconfig.job_config_file(RESULTS, model, job)
    text = jobconfig.job_config_text(config, model, job, cluster.job_resources(CFG, model)["gpu"])
    write_text_if_changed(path, text)
    return str(path)


def train_config_input(wildcards):
    return job_config_path(wildcards.model, "train")


def warmstart_config_input(wildcards):
    return job_config_path(wildcards.model, "warmstart")


def built_here_ref(repo_id):
    """The cache's `refs/main` of a repository the workflow builds (paths.BUILT_HERE): written
    last, once its snapshot is whole."""
    return str(cache_repo_dir(HF_CACHE, repo_id, BUILT_HERE[repo_id]) / "refs" / "main")


def hub_cache_of(wildcards, output):
    """The hub cache a `refs/main` output lies in (<cache>/<repo>/refs/main)."""
    return str(Path(output[0]).parents[2])


def model_input(wildcards):
    """The weights a cell starts from: the warm-start output for tiny models, the rehearsal's
    checkpoint for its id, else nothing to build (a fetched checkpoint)."""
    m = config["models"][wildcards.model]
    if m.get("kind", "tiny") == "tiny":
        return f"{ARTIFACTS}/{wildcards.model}/model/config.json"
    return [built_here_ref(m["path"])] if m.get("path") in BUILT_HERE else []


def data_input(wildcards):
    """The task's data when the workflow builds it (the rehearsal's data set), else nothing."""
    task = config.get("task", {})
    path = task.get("path")
    return [built_here_ref(path)] if task.get("source") == "parquet" and path in BUILT_HERE else []


def model_dir_arg(wildcards):
    m = config["models"][wildcards.model]
    if m.get("kind", "tiny") == "tiny":
        return f"{ARTIFACTS}/{wildcards.model}/model"
    return m["path"]


# The calibrated plan's requests (`python -m dlcrepro plan --calibrate RESULTS`, dlcrepro/cluster/calibrate.py),
# where that file exists: each job it measured or projected asks for what it says.
try:
    CALIBRATION = cluster.load_calibration(CFG, RESULTS)
except cluster.CalibrationError as e:
    raise WorkflowError(str(e))


def job_name(job, wildcards):
    """A job's name as the calibration file keys it: a cell's model/sampler/correction/seed<k>, a
    rollouts job's model/sampler/seed<k>, a θ_0 evaluation's model/seed<k>."""
    w = wildcards
    if job in ("train", "pilot"):
        return f"{w.model}/{w.sampler}/{w.correction}/seed{w.seed}"
    if job == "rollouts":
        return f"{w.model}/{w.sampler}/seed{w.seed}"
    if job == "initial_eval":
        return f"{w.model}/seed{w.seed}"
    return None


def job_resource(job, name):
    """One Slurm resource (gpu, runtime, mem_mb, cpus_per_task, or gres: the GPUs as a GRES string)
    of a job of kind `job` (train, pilot, rollouts, initial_eval, scan), as a function of its
    wildcards and attempt: cluster.job_resources, with the calibration's requests where it has the
    job, and twice the runtime at each retry (a job killed at its time limit resumes from its
    checkpoint); a training cell that copies another's run is a `copy` job."""

    def get(wildcards, attempt=1):
        kind = "copy" if job == "train" and same_cell(wildcards) is not None else job
        r = cluster.job_resources(
            CFG, wildcards.model, kind, getattr(wildcards, "sampler", None), CALIBRATION, job_name(job, wildcards), attempt
        )
        return cluster.gres(r) if name == "gres" else r[name]

    return get


def job_threads(job):
    """The OpenMP threads of a job of kind `job`, from the config (its cpus_per_task), never from
    snakemake's `{threads}`, which `--cores` caps: a cell's numbers must not depend on the cores
    snakemake was given (float reductions differ with the thread count)."""
    cpus = job_resource(job, "cpus_per_task")
    return lambda wildcards: cpus(wildcards)


# ----------------------------------------------------------------------------- the pilot
# The jobs that time every phase before the grid is submitted (workflow/rules/pilot.smk,
# dlcrepro/cluster/calibrate.py).


def pilot_cell_dir(model, sampler, correction, seed):
    return f"{RESULTS}/{cluster.PILOT_DIR}/{model}/{sampler}/{correction}/seed{seed}"


def pilot_targets():
    """Every file the pilot writes last: its cells' summaries, its rollouts and θ_0 evaluations."""
    cells = [f"{pilot_cell_dir(c.model, c.sampler, c.correction, c.seed)}/summary.json" for c in cluster.pilot_cells(CFG)]
    rollouts = [rollouts_file(*j) for j in cluster.pilot_rollouts_jobs(CFG)]
    initial = [initial_eval_file(*j) for j in cluster.pilot_initial_eval_jobs(CFG)]
    return initial + rollouts + cells


PILOT_SET = " ".join(f"--set {k}={v}" for k, v in cluster.PILOT_OVERRIDES.items())


# ----------------------------------------------------------------------------- the outputs
# Every table and figure, their files and their report captions: dlcrepro/report/outputs.py, the one list.


def output_files(items, directory):
    """The files of `items` (outputs.TABLES or outputs.FIGURES) in `directory`."""
    return [f for o in items for f in o.files(directory)]


def table_files():
    """Every file the tables job writes: each table as .tex, .md and .csv, and the findings input."""
    return output_files(outputs.TABLES, TABLES) + outputs.findings_input_files(TABLES)


def figure_files():
    """Every file the figures job writes: each figure as .pdf and .png."""
    return output_files(outputs.FIGURES, FIGURES)


def report_caption(output):
    """The report's caption of an output (outputs.py), as the .rst file Snakemake's report() reads,
    under RESULTS/_report/; rewritten only when its text changes. Absolute: report() takes a
    relative path from the rule file's directory."""
    path = Path(RESULTS, "_report", f"{output.name}.{output.kind}.rst").resolve()
    write_text_if_changed(path, f"{output.caption}\n")
    return str(path)


def reported_files(items, directory):
    """output_files, the one file of each output that the report shows marked with its category and
    caption (`snakemake --report report.html`)."""
    return [
        (report(f, category=o.category, caption=report_caption(o)) if o.reported(f) else f)
        for o in items
        for f in o.files(directory)
    ]


def reproduction_report():
    """The `reproduce` rule's report: this run against the committed study (dlcrepro/report/reproduce.py)."""
    return f"{TABLES}/{outputs.REPRODUCTION_REPORT}"


def all_outputs():
    """Every table and figure, every cell's summary, and the comparison with the committed study: a
    deleted cell is then a missing target, so rerunning schedules it (and through collect the tables
    and figures), although the tables are still on disk."""
    return table_files() + figure_files() + cell_outputs("summary.json") + [reproduction_report()]


# ----------------------------------------------------------------------------- the plan
# Before anything is submitted: the cells trained and copied, GPU-hours requested and estimated,
# the largest job, and the weights and data the jobs read (dlcrepro/cluster/plan.py, the same lines as
# `python -m dlcrepro plan`). Shown while the Snakefile is parsed, because onstart does not run on
# dry runs, by the main snakemake only (a Slurm job's snakemake parses this file too); a run that
# asks for no GPU shows it at onstart when it submits to a cluster.
PLAN_SHOWN = []


def unlocking():
    """`snakemake --unlock`: it loads no model, and must work on any grid. Snakemake 9 parses this
    file (DAGApi.__post_init__) before the command line's action runs (dag_api.unlock()), and
    the workflow object carries no sign of it then (dag_settings is unset, execution_settings
    are never set for --unlock), so the command line is the only witness."""
    return "--unlock" in sys.argv[1:]


def show_plan(on_cluster=False):
    """Print the plan when the grid asks for GPUs, the run submits to a cluster, or
    something is missing; then stop, before any job exists, with the fetch lines, if a
    cell still to run needs what is missing (cluster.blocking: a finished grid's tables,
    figures and dry runs need no weights)."""
    if not workflow.is_main_process or PLAN_SHOWN or unlocking():
        return
    missing = cluster.missing_message(CFG)
    asks_gpu = any(cluster.job_resources(CFG, m)["gpu"] > 0 for m in CFG.grid.models)
    if missing or asks_gpu or on_cluster:
        PLAN_SHOWN.append(True)
        source = " ".join(str(f) for f in workflow.configfiles)
        print(cluster.plan_text(CFG, source), end="\n\n", file=sys.stderr, flush=True)
    if missing:
        raise WorkflowError(f"{missing}\nNothing was submitted.")


# ----------------------------------------------------------------------------- fork server
# config `fork_server`: on the local executor, training jobs fork from one process that imported
# torch and vLLM once (dlcrepro/run/server.py) instead of paying ~10 s of imports and teardown each.
# The server lives as long as this snakemake; jobs find it through DLCREPRO_SERVER in their
# environment (not a rule param or shell text, which would make every cell look changed).


def fork_server_wanted():
    if not config.get("fork_server") or not workflow.local_exec:
        return False
    # under --sdm conda jobs run the env's python: a server of another python would not match
    return DeploymentMethod.CONDA not in workflow.deployment_settings.deployment_method


def start_fork_server():
    """Start the server if this run has training jobs to do; jobs run in their own processes
    while it imports, and whenever it is absent."""
    if not fork_server_wanted() or not any(j.rule.name in ("train", "pilot_cell") for j in workflow.dag.needrun_jobs()):
        return None
    from dlcrepro.run.server import private_dir  # torch-free, like dlcrepro.core.config

    path = str(private_dir() / f"snakemake-{os.getpid()}.sock")  # 0700: no other user reaches it
    Path(LOGS).mkdir(parents=True, exist_ok=True)
    log = open(f"{LOGS}/fork_server.log", "w")
    cmd = [PYTHON, "-m", "dlcrepro", "serve", "--socket", path, "--watch-pid", str(os.getpid())]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    os.environ.update(DLCREPRO_SERVER=path)  # inherited by the jobs this snakemake starts
    return proc


def stop_fork_server(proc):
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ----------------------------------------------------------------------------- collect's rerun line


def rerun_command():
    """This snakemake's command line as typed, for the line `collect` gives to rerun a damaged cell
    (through the environment, as the fork server's socket: no rule's params change with it)."""
    argv = list(sys.argv)
    if argv and argv[0].endswith("__main__.py"):  # python -m snakemake
        argv[:1] = [sys.executable, "-m", "snakemake"]
    return shlex.join(argv)


if workflow.is_main_process:
    os.environ.update(DLCREPRO_RERUN_COMMAND=rerun_command())


# ----------------------------------------------------------------------------- stopping
# SIGTERM, SIGINT or SIGHUP to this snakemake on the local executor: every job and the fork server
# stop within seconds, then snakemake leaves through its own Ctrl-C path, which marks the running
# jobs failed (their outputs removed) and releases its lock. Left to Snakemake, SIGTERM and SIGINT
# wait for the running jobs to finish (a whole cell), and SIGHUP kills it with its lock held and
# its jobs running. Installed at onstart (Snakemake sets its own SIGTERM handler just before).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOPPED_BY = []


def say(text):
    """A line on stderr, safe inside a signal handler (no buffered stream to re-enter), and
    harmless when stderr is gone (a hung-up terminal)."""
    try:
        os.write(2, f"{text}\n".encode())
    except OSError:
        pass


def stop_now(signum, frame):
    if STOPPED_BY:  # a second signal while stopping: the first one's stop is under way
        return
    STOPPED_BY.append(signal.Signals(signum).name)
    say(f"snakemake got {STOPPED_BY[0]}: stopping every job and the fork server now")
    procs.stop_descendants()  # jobs, their processes, the fork server and the jobs it forked
    raise KeyboardInterrupt


def stop_on_signals():
    if workflow.is_main_process and workflow.local_exec:
        for sig in STOP_SIGNALS:
            signal.signal(sig, stop_now)


def stopped_message():
    """What happened and what to do, as snakemake ends after a stop signal (onerror)."""
    if STOPPED_BY:
        say(
            f"Stopped on {STOPPED_BY[0]}: no job and no fork server of this run is left running, and its "
            "lock is released. To go on, rerun the same command: each cell resumes from its last checkpoint."
        )


# ----------------------------------------------------------------------------- findings from other CPU kinds


def other_machine_findings():
    """What other kinds of CPU gave for this grid, committed under <committed_tables_dir>/other_machines/
    (outputs.other_machine_files: findings tables, or a study's findings input; docs/method.md#across-machines):
    the tables job reads their verdicts, so a finding seen on one kind only reads "seen on one machine"."""
    return outputs.other_machine_files(COMMITTED_TABLES) if COMMITTED_TABLES else []


# ----------------------------------------------------------------------------- did the run reproduce the committed study?


def committed_findings_input():
    """The committed findings inputs that `reproduce` compares this run with -- the committed
    study's own and each other CPU kind's (dlcrepro/report/reproduce.py picks the one of this CPU's kind)."""
    if not COMMITTED_TABLES:
        return []
    own = outputs.findings_input_files(COMMITTED_TABLES)
    others = [f for f in outputs.other_machine_files(COMMITTED_TABLES) if Path(f).name in outputs.FINDINGS_INPUT]
    return [f for f in own if Path(f).exists()] + others


def committed_arg(wildcards):
    """`reproduce`'s --committed: the committed study's tables ("": none, which the report says)."""
    return shlex.quote(COMMITTED_TABLES)


def publish_args(wildcards):
    """`publish`'s destinations: the committed study's tables and figures ("": none, refused by name)."""
    return f"--to-tables {shlex.quote(COMMITTED_TABLES)} --to-figures {shlex.quote(COMMITTED_FIGURES)}"


def say_whether_reproduced():
    """At the end of a run whose targets include the comparison: the report's summary (its lines
    before the figure), where the report and figure are, and the command of Snakemake's own report."""
    if not any(j.rule.name == "reproduce" for j in workflow.dag.jobs):
        return
    report_md = Path(reproduction_report())
    if not report_md.exists():
        return
    summary = report_md.read_text().split("\n![")[0].splitlines()[1:]  # its headline and where each side ran
    png = next(f for f in outputs.REPRODUCTION.files(FIGURES) if f.endswith(".png"))
    lines = [line.replace("**", "") for line in summary if line]
    lines += [f"Cell by cell: {report_md} and {png}.", "Every figure and table with its caption: snakemake --report report.html"]
    say("\n".join(lines))


def other_machine_args(files):
    return ("--other-machines " + " ".join(shlex.quote(f) for f in files)) if files else ""


# ----------------------------------------------------------------------------- the decide run
# `snakemake decide` (workflow/rules/decide.smk, dlcrepro/study/decide.py): a checkpoint per look; each
# look reads the cells the previous look read and the batch it asked for.
DECIDE = f"{RESULTS}/_decide"


def decide_design_input(wildcards):
    """<results_dir>/_decide/design.json: the design, the seed order, the grid's cells and copies and
    the cost model's prices (decide.design_file), rewritten only when they change."""
    try:
        text = json.dumps(decide.design_file(CFG), indent=1, sort_keys=True) + "\n"
    except ConfigError as e:
        raise WorkflowError(str(e))
    path = Path(DECIDE) / "design.json"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return str(path)


def decide_look_file(k):
    return f"{DECIDE}/look{k}.json"


def decide_look_record(k):
    """Look k's record, once its checkpoint has run (until then Snakemake re-evaluates the DAG later)."""
    return json.loads(Path(checkpoints.decide_look.get(k=k).output.look).read_text())


def decide_cells(k):
    """The cells (model/sampler/correction/seed<k>) look k reads: the grid at look 0, else look
    k - 1's and the batch it asked for."""
    previous = decide_look_record(k - 1) if k > 0 else None
    return decide.look_cells(k, decide.first_look_cells(CFG), previous)


def decide_cell_files(name):
    def get(wildcards):
        return [f"{RESULTS}/{c}/{name}" for c in decide_cells(int(wildcards.k))]

    return get


def decide_previous_input(wildcards):
    k = int(wildcards.k)
    return [decide_look_file(k - 1)] if k > 0 else []


def decide_previous_arg(wildcards, input):
    return f"--previous {input.previous}" if input.previous else ""


def decide_looks(wildcards):
    """Every look's record, up to the one that asks for no more seeds."""
    k, files = 0, []
    while True:
        files.append(checkpoints.decide_look.get(k=k).output.look)
        if decide_look_record(k)["done"]:
            return files
        k += 1
