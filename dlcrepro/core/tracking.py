"""Each training step's metrics row, also sent to the experiment trackers researchers already
watch: TensorBoard, Weights & Biases, MLflow (config section `tracking`, docs/tracking.md).

`metrics.parquet` stays the record. A tracker is a window on a running study: its run is named
after the grid cell (`tiny/stale/dlc/seed0`) and grouped with the cell's other seeds
(`tiny/stale/dlc`); it gets the cell's config as its parameters at the start, each step's row
under the glossary's column names (the mismatch parts' nested as the frameworks', `mismatch/lag/k3_kl`:
`tracker_key`) as the step ends (a NaN cell is left out: a probe or eval column
appears at the steps it is measured), and the run's summary at the end.

A backend is one class with `start(cell, params)`, `log(step, row)` and `finish(summary)`
(`summary` None: the run failed), registered by name. `Trackers` drives a run's backends and keeps
each one's failure to itself: the first error a backend raises (a lost server) is reported once, in
the cell's log, and that backend logs no more in this run; training goes on. No backend is imported
before a run starts one (or the fork server of a study that names it, once): this module imports
only the standard library, so dlcrepro/core/config.py (torch-free: the standard library, PyYAML and the
package's registries) can import it to check the names against `BACKENDS` and that each one's
package is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

EXTRA = "dlcrepro[tracking]"  # the optional extra that installs every backend
ENV = "DLCREPRO_TRACKING"  # the workflow hands its jobs the study's `tracking` section here (JSON)
IDS_FILE = "tracking.json"  # in the cell's directory: each backend's run id, which a resumed run continues


@dataclass
class TrackingConfig:
    """The config's `tracking` section (config.Config.tracking), declared by the room that reads it."""

    backends: list[str] = field(default_factory=list)
    """experiment trackers each training step's metrics row also goes to, any of tensorboard,
    wandb, mlflow (pip install 'dlcrepro[tracking]'); empty: none, metrics.parquet alone."""
    project: str = ""
    """the W&B project and MLflow experiment of the runs ("": dlcrepro-<name>)."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """W&B: "offline" writes each run's files under wandb_dir, uploaded later by `wandb sync` (no
    network, as on compute nodes); "online" streams them to the W&B server."""
    wandb_entity: str = ""
    """W&B: the user or team the project belongs to ("": the logged-in user's default)."""
    wandb_dir: str = ""
    """W&B: where run files are written ("": <results_dir>/_wandb)."""
    mlflow_uri: str = ""
    """MLflow tracking URI: a server (http://host:5000) or a database (sqlite:///path.db) ("":
    $MLFLOW_TRACKING_URI, else the SQLite database <results_dir>/_mlflow.db)."""
    tensorboard_dir: str = ""
    """TensorBoard: the log directory, a subdirectory <model>/<sampler>/<correction>/seed<k> per
    run ("": <results_dir>/_tensorboard)."""


class Tracker(Protocol):
    """One backend's run of one cell: a `Backend` subclass, registered by name."""

    name: str
    package: str  # what must be installed (config.validate checks it)
    modules: tuple[str, ...]  # what it imports, which a fork server may import first
    run_id: str  # what a resumed run continues (IDS_FILE), "" where the backend has none

    def start(self, cell: dict, params: dict[str, Any]) -> None: ...

    def log(self, step: int, row: dict[str, float]) -> None: ...

    def finish(self, summary: dict | None) -> None: ...


BACKENDS: dict[str, type] = {}


def register(cls: type) -> type:
    BACKENDS[cls.name] = cls
    return cls


def missing_packages(backends: list[str]) -> dict[str, str]:
    """{backend: the package it needs} for each named backend whose package is not installed."""
    return {b: BACKENDS[b].package for b in backends if b in BACKENDS and importlib.util.find_spec(BACKENDS[b].package) is None}


# ----------------------------------------------------------------------------- what is logged


def run_name(cell: dict) -> str:
    """A cell's run: `model/sampler/correction/seed<k>`, the layout of its results directory."""
    return f"{run_group(cell)}/seed{cell['seed']}"


def run_group(cell: dict) -> str:
    """The cell's seeds together: `model/sampler/correction`."""
    return f"{cell['model']}/{cell['sampler']}/{cell['correction']}"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level with dotted keys; a list or None as its JSON text."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out |= flatten(v, key + ".")
        elif isinstance(v, (list, tuple, dict)) or v is None:
            out[key] = json.dumps(v)
        else:
            out[key] = v
    return out


def cell_params(cfg, cell: dict) -> dict[str, Any]:
    """The run's parameters: the cell (model, sampler, correction, seed, model_dir) and the config
    `cfg` (a config.Config) it trains under, under the config's own dotted keys (those `--set`
    takes): `name`, `task.*`, `engine.*`, `train.*` with the model's overrides applied, and
    `models.<model>.*`."""
    model = dataclasses.asdict(cfg.models[cell["model"]])
    model.pop("train", None)  # already applied in `train`
    return flatten({
        **cell,
        "name": cfg.name,
        "task": dataclasses.asdict(cfg.task),
        "engine": dataclasses.asdict(cfg.engine),
        "train": dataclasses.asdict(cfg.train_for(cell["model"])),
        "models": {cell["model"]: model},
    })


# The frameworks' dashboards nest their mismatch keys (verl's `rollout_corr/k3_kl`): a mismatch part's
# column `mismatch_<part>_<key>` (diagnostics.mismatch_column, diagnostics.MISMATCH_PARTS) goes to a
# tracker as `mismatch/<part>/<key>`, its part a group of its own beside a framework's run.
NESTED = ("mismatch_total_", "mismatch_discrepancy_", "mismatch_lag_")


def tracker_key(column: str) -> str:
    """The key a tracker logs a metrics column under: its name, but `mismatch/<part>/<key>` for a
    mismatch part's `mismatch_<part>_<key>`."""
    for prefix in NESTED:
        if column.startswith(prefix):
            return prefix.rstrip("_").replace("_", "/") + "/" + column.removeprefix(prefix)
    return column


def step_values(row: dict) -> dict[str, float]:
    """A metrics row as a tracker takes it: every column but `step` (the x axis) under its
    `tracker_key`, NaN cells left out."""
    return {tracker_key(k): float(v) for k, v in row.items() if k != "step" and not (isinstance(v, float) and math.isnan(v))}


def summary_numbers(summary: dict) -> dict[str, float]:
    """The summary's numbers, flat and dotted (`seconds_by_phase.sample`), for a backend that takes
    only numbers beside the summary itself."""
    return {k: float(v) for k, v in flatten(summary).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


# ----------------------------------------------------------------------------- backends


class Backend:
    """What every backend holds: its settings (resolved), the step its run starts at (1, or the
    resumed step), and the run id it continues ("": a new run)."""

    name, package, modules = "", "", ()

    def __init__(self, tc: TrackingConfig, first_step: int, run_id: str = ""):
        self.tc, self.first_step, self.run_id = tc, first_step, run_id


@register
class TensorBoardTracker(Backend):
    """Scalars under the column names in `<tensorboard_dir>/<model>/<sampler>/<correction>/seed<k>`
    (double precision: the table's numbers exactly), the config and summary as text. A resumed run
    writes a restart marker at its first step, so TensorBoard drops the steps it takes again."""

    name, package, modules = "tensorboard", "tensorboard", ("torch.utils.tensorboard",)

    def start(self, cell, params):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(self.tc.tensorboard_dir) / run_name(cell)
        # purge_step writes a session-start marker: the first one opens the run, a later one (a
        # resume) tells TensorBoard's reader to drop what was logged from that step on
        self.writer = SummaryWriter(str(self.dir), purge_step=self.first_step)
        if self.first_step == 1:
            self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in params.items()), 0)
        self.writer.flush()

    def log(self, step, row):
        for k, v in step_values(row).items():
            self.writer.add_scalar(k, v, step, new_style=True, double_precision=True)
        self.writer.flush()  # visible to a running TensorBoard as the step ends

    def finish(self, summary):
        if summary is not None:
            text = json.dumps(summary, indent=1)
            self.writer.add_text("summary", "\n".join("    " + line for line in text.splitlines()), summary.get("steps", 0))
        self.writer.close()


@register
class WandbTracker(Backend):
    """A W&B run (`wandb_mode` offline: files under `wandb_dir` for `wandb sync`; online: streamed),
    named after the cell, grouped with its seeds, tagged with its model, sampler and correction."""

    name, package, modules = "wandb", "wandb", ("wandb",)

    def start(self, cell, params):
        import wandb

        Path(self.tc.wandb_dir).mkdir(parents=True, exist_ok=True)
        self.run_id = self.run_id or uuid.uuid4().hex[:12]
        self.run = wandb.init(
            project=self.tc.project, entity=self.tc.wandb_entity or None, name=run_name(cell), group=run_group(cell),
            job_type="train", tags=[str(cell[k]) for k in ("model", "sampler", "correction")], config=params,
            dir=self.tc.wandb_dir, mode=self.tc.wandb_mode, id=self.run_id, resume="allow", reinit="create_new",
            # no capture of the job's stdout/stderr (progress bars; the fork server hands them over)
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, step, row):
        self.run.log(step_values(row), step=step)

    def finish(self, summary):
        if summary is not None:
            self.run.summary.update(summary)
        self.run.finish(exit_code=0 if summary is not None else 1)


# MLflow's client retries a failed request 7 times with a doubling back-off (minutes on a lost
# server, once per run: the backend is dropped after its first failure). Where the user has not
# set them, a run asks for a few seconds instead.
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


@register
class MLflowTracker(Backend):
    """An MLflow run in experiment `project` at `mlflow_uri` (a server or a database): the config
    as parameters, one batch of metrics per step, the summary's numbers as metrics and the whole
    summary as the artifact `summary.json`; tags name the cell and its group.

    A step's batch is sent in MLflow's background queue (a synchronous request to a server took
    ~50 ms, 5 % of a tiny-model step); the next step first waits for it, so a failure surfaces,
    and is reported, one step late."""

    name, package, modules = "mlflow", "mlflow", ("mlflow", "mlflow.entities")
    last_step, pending = 0, None  # the last step sent, and its batch while MLflow's queue holds it

    def start(self, cell, params):
        for k, v in MLFLOW_HTTP.items():
            os.environ.setdefault(k, v)
        from mlflow import MlflowClient
        from mlflow.entities import Param

        with self._sqlite_lock():  # the client opens its store, which migrates a new database
            self.client = MlflowClient(tracking_uri=self.tc.mlflow_uri)
            experiment = None if self.run_id else self._experiment()
        if self.run_id:  # a resumed run continues its MLflow run
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {"model": cell["model"], "sampler": cell["sampler"], "correction": cell["correction"],
                "seed": str(cell["seed"]), "group": run_group(cell)}
        run = self.client.create_run(experiment, run_name=run_name(cell), tags=tags)
        self.run_id = run.info.run_id
        self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params.items()])

    def _experiment(self) -> str:
        """The experiment `project`, created by the first run that needs it (two jobs may race)."""
        from mlflow.exceptions import MlflowException

        for _ in range(2):
            exp = self.client.get_experiment_by_name(self.tc.project)
            if exp is not None:
                return exp.experiment_id
            try:
                return self.client.create_experiment(self.tc.project, artifact_location=self._artifacts())
            except MlflowException:  # created meanwhile by another job: look it up again
                pass
        raise RuntimeError(f"MLflow experiment {self.tc.project!r} could be neither found nor created")

    def _sqlite_db(self) -> Path | None:
        return Path(self.tc.mlflow_uri.removeprefix("sqlite:///")) if self.tc.mlflow_uri.startswith("sqlite:///") else None

    @contextmanager
    def _sqlite_lock(self):
        """Jobs starting at once on a new SQLite file would each run MLflow's schema migration on it,
        and all but one fail (seen with the workflow's two local jobs): opening the store, which
        creates and migrates the file, and finding the experiment hold a lock beside it. A server
        needs none."""
        db = self._sqlite_db()
        if db is None:
            yield
            return
        import fcntl

        db.parent.mkdir(parents=True, exist_ok=True)
        with open(db.parent / f".{db.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _artifacts(self) -> str | None:
        """Beside a local database, `<db>_artifacts/` (MLflow's own default is ./mlruns in the
        working directory); a server keeps its own."""
        db = self._sqlite_db()
        return None if db is None else (db.parent / f"{db.stem}_artifacts").resolve().as_uri()

    def log(self, step, row):
        from mlflow.entities import Metric

        self._wait()
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in step_values(row).items()]
        self.pending = self.client.log_batch(self.run_id, metrics=metrics, synchronous=False)
        self.last_step = step

    def _wait(self) -> None:
        """The previous step's batch is in (raises its failure, naming that step)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                pending.wait()
            except Exception as e:
                raise RuntimeError(f"step {self.last_step}'s metrics were not logged: {e}") from e

    def finish(self, summary):
        self._wait()
        if summary is None:
            self.client.set_terminated(self.run_id, status="FAILED")
            return
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), summary.get("steps", self.last_step)
        self.client.log_batch(self.run_id,
                              metrics=[Metric(f"summary.{k}", v, now, step) for k, v in summary_numbers(summary).items()])
        self.client.log_dict(self.run_id, summary, "summary.json")
        self.client.set_terminated(self.run_id, status="FINISHED")


# ----------------------------------------------------------------------------- a run's trackers


class Trackers:
    """A run's backends, each isolated from the run and from each other: the first error one raises
    is reported once through `note` (the cell's log) and that backend is dropped; the run goes on.
    `status` says, per backend, where the run was logged or why it stopped; `seconds`, the wall
    time the run spent in them."""

    def __init__(self, backends: list[Tracker], note: Callable[[str], None], ids_file: Path | None = None):
        self.active, self.note, self.ids_file = list(backends), note, ids_file
        self.status: dict[str, str] = {}
        self.step, self.seconds = 0, 0.0

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        t0 = time.perf_counter()
        for t in list(self.active):
            try:
                call(t)
            except Exception as e:  # a tracker never stops training: the table is the record
                self.active.remove(t)
                where = f"at step {self.step}" if what == "log" else f"in {what}"
                self.status[t.name] = f"failed {where}: {type(e).__name__}: {e}"
                self.note(f"tracking: {t.name} failed {where} and logs no more in this run "
                          f"(training goes on; metrics.parquet is the record): {type(e).__name__}: {str(e)[:300]}")
        self.seconds += time.perf_counter() - t0

    def start(self, cell: dict, params: dict[str, Any]) -> None:
        self._each("start", lambda t: t.start(cell, params))
        for t in self.active:
            self.status[t.name] = f"logged as {run_name(cell)}" + (f" (run id {t.run_id})" if t.run_id else "")
        if self.active:
            self.note(f"tracking: {run_name(cell)} in " + ", ".join(f"{t.name}" + (f" (run id {t.run_id})" if t.run_id else "")
                                                                   for t in self.active))
        ids = {t.name: t.run_id for t in self.active if t.run_id}
        if self.ids_file is not None and ids:
            from .util import atomic_write_text

            atomic_write_text(self.ids_file, json.dumps(ids, indent=1))

    def log(self, step: int, row: dict) -> None:
        self.step = step
        self._each("log", lambda t: t.log(step, row))

    def finish(self, summary: dict | None) -> None:
        self._each("finish", lambda t: t.finish(summary))


def resolved(tc: TrackingConfig, results_dir: str | Path, name: str) -> TrackingConfig:
    """`tc` with its defaults filled in: the project `dlcrepro-<name>`, the W&B and TensorBoard
    directories under `results_dir`, and the MLflow URI from $MLFLOW_TRACKING_URI, else the SQLite
    database `<results_dir>/_mlflow.db` (MLflow 3 refuses a new directory store)."""
    results = Path(results_dir).resolve()
    return dataclasses.replace(
        tc,
        project=tc.project or f"dlcrepro-{name}",
        wandb_dir=tc.wandb_dir or str(results / "_wandb"),
        tensorboard_dir=tc.tensorboard_dir or str(results / "_tensorboard"),
        mlflow_uri=tc.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{results / '_mlflow.db'}",
    )


def open_trackers(cfg, out: Path, note: Callable[[str], None], first_step: int) -> Trackers:
    """The backends `cfg.tracking` (`cfg` a config.Config) names for the cell in `out`, not yet started; a resumed run
    (`first_step` > 1, or ids left in the cell's IDS_FILE) continues the runs it had."""
    tc = resolved(cfg.tracking, cfg.results_dir, cfg.name)
    ids_file = Path(out) / IDS_FILE
    ids = json.loads(ids_file.read_text()) if ids_file.exists() else {}
    return Trackers([BACKENDS[b](tc, first_step, ids.get(b, "")) for b in tc.backends], note, ids_file)


def modules_to_preload(section: dict | None) -> list[str]:
    """The modules of the backends `section` names, for a process that forks jobs to import once."""
    return [m for b in (section or {}).get("backends", []) if b in BACKENDS for m in BACKENDS[b].modules]


def from_env() -> dict | None:
    """The `tracking` section the workflow handed this job ($DLCREPRO_TRACKING), if any."""
    text = os.environ.get(ENV)
    return json.loads(text) if text else None
