"""What a grid asks of a cluster before anything runs: its jobs, their resources and cost, the
weights and data they read from the local cache, and the device check each job makes first.

Torch-free (like grid.py and config.py): the Snakefile imports it to lay out the DAG and print the
plan, also from a Snakemake environment without torch. `python -m dlcrepro plan` prints the same
lines. `check_device` imports torch only when a job asks for a GPU.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Config, ConfigError
from .grid import computed_as, get_sampler
from .registry import correction_info

# What a cell that copies another one's metrics asks of a cluster: no GPU, one core, minutes.
COPY_RESOURCES = {"gpu": 0, "runtime": 10, "mem_mb": 2000, "cpus_per_task": 1}
# A training job's resources where neither its model nor the config's `resources` name them.
TRAIN_DEFAULTS = {"gpu": 0, "runtime": 30, "mem_mb": 4000, "cpus_per_task": 1}


@dataclass(frozen=True)
class Cell:
    """One grid cell and, if it copies another cell's run, that cell's correction."""

    model: str
    sampler: str
    correction: str
    seed: int
    same_as: str | None = None  # the correction of the cell whose run this one copies

    @property
    def name(self) -> str:
        return f"{self.model}/{self.sampler}/{self.correction}/seed{self.seed}"


def _excluded(cell: dict, rules: list[dict]) -> bool:
    return any(all(str(cell[k]) == str(v) for k, v in r.items()) for r in rules)


def grid_cells(cfg: Config) -> list[Cell]:
    """The grid (models x samplers x corrections x seeds, exclusions removed), each cell with the
    cell it copies: one whose run it is bit for bit (grid.SAME_AS) and that the grid holds; a cell
    whose twin the grid leaves out trains."""
    g = cfg.grid
    cells = [
        dict(model=m, sampler=s, correction=c, seed=int(k))
        for m, s, c, k in itertools.product(g.models, g.samplers, g.corrections, g.seeds)
    ]
    cells = [c for c in cells if not _excluded(c, g.exclude)]
    keys = {(c["model"], c["sampler"], c["correction"], c["seed"]) for c in cells}
    return [Cell(**c, same_as=copy_source(cfg, c["model"], c["sampler"], c["correction"], c["seed"], keys)) for c in cells]


def copy_source(cfg: Config, model: str, sampler: str, correction: str, seed: int, keys: set) -> str | None:
    """The correction of the grid cell (in `keys`) whose run this cell's run is, or None."""
    same, _ = computed_as(sampler, correction, cfg.train_for(model))
    return same if same != correction and (model, sampler, same, int(seed)) in keys else None


def job_resources(cfg: Config, model: str, copy: bool = False) -> dict[str, int]:
    """A training job's Slurm resources: the model's `resources`, else the config's `resources`,
    else TRAIN_DEFAULTS; a copying cell's are COPY_RESOURCES. Values given on a command line
    arrive as text, hence int()."""
    if copy:
        return dict(COPY_RESOURCES)
    own = cfg.models[model].resources
    return {k: int(own.get(k, cfg.resources.get(k, d))) for k, d in TRAIN_DEFAULTS.items()}


def gpu_key(cfg: Config, model: str) -> str:
    """The config key that sets a model's GPU count."""
    return f"models.{model}.resources.gpu" if "gpu" in cfg.models[model].resources else "resources.gpu"


# ----------------------------------------------------------------------------- device check


class DeviceError(ConfigError):
    """A job whose config asks for a GPU runs where torch has none."""


def check_device(cfg: Config, model: str) -> None:
    """Stop a job that asks for GPUs (`resources.gpu` > 0) before anything loads when torch is a
    CPU-only build or sees no CUDA device: the paper's model must never train on CPU. The error
    names the interpreter, torch's build and the fix."""
    gpus = job_resources(cfg, model)["gpu"]
    if gpus <= 0:
        return
    import torch

    cuda_build = torch.version.cuda
    seen = torch.cuda.device_count() if cuda_build and torch.cuda.is_available() else 0
    if seen >= gpus:
        return
    where = ", ".join(f"{k}={os.environ[k]}" for k in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID") if k in os.environ)
    env = f"python {sys.executable}, torch {torch.__version__}" + (f" (CUDA {cuda_build})" if cuda_build else "") + (f", {where}" if where else "")
    if not cuda_build:
        why = "this torch is a CPU-only build"
        fix = (
            "run the job in the GPU environment: build it with `bash scripts/setup.sh --gpu` (docs/cluster.md, "
            "\"2. Build the environments\"), or give the jobs its interpreter (`python: /path/to/env/bin/python` "
            "in the config) or `--sdm conda` (envs/train-gpu.yaml)"
        )
    else:
        why = f"torch sees {seen} CUDA device(s)"
        fix = "submit the job to a GPU partition with its GPU request (`--profile slurm` sets --gres from the config)"
    raise DeviceError(
        f"{gpu_key(cfg, model)}={gpus} asks for a GPU, but {why} ({env}); refusing to train {model!r} on CPU. "
        f"Fix: {fix}; to train this model on CPU on purpose, set {gpu_key(cfg, model)}: 0."
    )


# ----------------------------------------------------------------------------- cost model
# docs/cluster.md, "Runtime and GPU-hours": the trainer's share of a paper step measured on one H200
# (gpu_check piece `paper-trainer`, 512 sequences, ~150k response tokens); the engine's share is a
# model (throughput assumed, not measured).


@dataclass(frozen=True)
class StepCost:
    """Seconds of one step of a 512-sequence batch on one H200, and the engine's throughput."""

    logprobs_s: float  # trainer log-probs at θ_t and θ_s (measured)
    probes_s: float  # the two probe gradients and θ_0 (measured; on probe steps only)
    correction_s: float  # the correction's gradient (measured, dlc)
    engine_tokens_per_s: float  # generated tokens per second (assumed)
    sync_s: float  # two weight syncs (assumed)


COST_MODEL: dict[str, StepCost] = {
    "Qwen/Qwen3-0.6B": StepCost(6.0, 18.3, 10.5, 20_000, 3.0),
    "Qwen/Qwen3-1.7B": StepCost(7.9, 28.3, 17.0, 12_000, 6.0),
}
COST_BATCH = 512  # sequences per step the trainer shares were measured at
RESPONSE_TOKENS = 300  # mean response length assumed
ENGINE_START_S = 180  # CUDA graph capture of two engines


def step_cost(cfg: Config, model: str) -> StepCost | None:
    """The cost model's entry for a model: by Hugging Face id, or a local directory of that name."""
    path = cfg.models[model].path or ""
    for hf_id, cost in COST_MODEL.items():
        if path == hf_id or Path(path).name.lower() == hf_id.split("/")[-1].lower():
            return cost
    return None


def estimated_minutes(cfg: Config, model: str) -> float | None:
    """Minutes of one trained cell by the cost model (None: the model is not in it):
    steps × (trainer shares scaled to the batch + probe share × probes + generated tokens /
    throughput + syncs) + evaluations + engine start."""
    cost = step_cost(cfg, model)
    if cost is None:
        return None
    t = cfg.train_for(model)
    batch = t.prompts_per_step * t.responses_per_prompt
    scale, probe_share = batch / COST_BATCH, 1 / t.probe_every
    engine_tokens = batch * RESPONSE_TOKENS * (1 + 2 * probe_share)  # the run's batch and two probe batches
    step = scale * (cost.logprobs_s + cost.correction_s + probe_share * cost.probes_s) + engine_tokens / cost.engine_tokens_per_s + cost.sync_s
    eval_steps = {k for k in range(1, t.steps + 1) if k % t.eval_every == 0} | {t.steps}
    # each eval step's; θ_0's is its seed's initial_eval job's (initial_eval_minutes)
    evals = len(eval_steps) * eval_answers_per_eval(cfg, model) * RESPONSE_TOKENS / cost.engine_tokens_per_s
    return (t.steps * step + evals + ENGINE_START_S) / 60


def initial_eval_jobs(cfg: Config) -> list[tuple[str, int]]:
    """(model, seed) of every θ_0 evaluation job (dlcrepro/initial_eval.py): one per model and seed
    with a trained cell to read it."""
    return list(dict.fromkeys((c.model, c.seed) for c in grid_cells(cfg) if c.same_as is None))


def initial_eval_minutes(cfg: Config, model: str) -> float | None:
    """Minutes of one θ_0 evaluation job by the cost model: one evaluation's answers and one
    engine's start; None where the model is not in the cost model."""
    cost = step_cost(cfg, model)
    if cost is None:
        return None
    return (eval_answers_per_eval(cfg, model) * RESPONSE_TOKENS / cost.engine_tokens_per_s + ENGINE_START_S / 2) / 60


def initial_eval_job_resources(cfg: Config, model: str) -> dict[str, int]:
    """A θ_0 evaluation job's Slurm resources: a training job's of the model, its runtime twice the
    cost model's estimate rounded up to 10 minutes where the model is in it (as a rollouts job's)."""
    r = job_resources(cfg, model)
    est = initial_eval_minutes(cfg, model)
    if est is not None:
        r["runtime"] = min(r["runtime"], 10 * math.ceil(2 * est / 10))
    return r


def rollouts_jobs(cfg: Config) -> list[tuple[str, str, int]]:
    """(model, sampler, seed) of every shared-rollouts job (dlcrepro/rollouts.py): a lagged sampler's
    seed with a trained cell to read it."""
    jobs = {}
    for c in grid_cells(cfg):
        t = cfg.train_for(c.model)
        if c.same_as is None and get_sampler(c.sampler).shared_steps(t.steps, t.sync_every) > 0:
            jobs[(c.model, c.sampler, c.seed)] = True
    return list(jobs)


def shared_sampling_minutes(cfg: Config, model: str, sampler: str) -> float | None:
    """Minutes of generating the batches a lagged sampler's cells share (its steps before the first
    sync), by the cost model: what its rollouts job takes (and each cell that reads it no longer
    does); None where the model is not in the cost model."""
    cost = step_cost(cfg, model)
    if cost is None:
        return None
    t = cfg.train_for(model)
    steps = get_sampler(sampler).shared_steps(t.steps, t.sync_every)
    return steps * t.prompts_per_step * t.responses_per_prompt * RESPONSE_TOKENS / cost.engine_tokens_per_s / 60


def rollouts_minutes(cfg: Config, model: str, sampler: str) -> float | None:
    """Minutes of one rollouts job by the cost model: its generated tokens and one engine's start."""
    shared = shared_sampling_minutes(cfg, model, sampler)
    return None if shared is None else shared + ENGINE_START_S / 2 / 60


def rollouts_job_resources(cfg: Config, model: str, sampler: str) -> dict[str, int]:
    """A rollouts job's Slurm resources: a training job's of the model, its runtime twice the cost
    model's estimate rounded up to 10 minutes (the training jobs' rule) where the model is in it."""
    r = job_resources(cfg, model)
    est = rollouts_minutes(cfg, model, sampler)
    if est is not None:
        r["runtime"] = min(r["runtime"], 10 * math.ceil(2 * est / 10))
    return r


def eval_answers_per_eval(cfg: Config, model: str) -> int:
    """Answers the BF16 probe engine generates in one evaluation (`train.Trainer.evaluate`, run for
    θ_0 and at every eval step), whatever `eval_mode` reports: a greedy answer and `eval_samples`
    sampled ones per eval problem, and with `eval_on: pool` a greedy answer per held-out test
    problem as well:

        |eval problems| × (1 + eval_samples) + [eval_on = pool] × n_test,

    the eval problems being the n_test held-out ones, or the RL pool's min(pool_size, n_train)."""
    t = cfg.train_for(model)
    if t.eval_on == "pool":
        return min(t.pool_size, cfg.task.n_train) * (1 + t.eval_samples) + cfg.task.n_test
    return cfg.task.n_test * (1 + t.eval_samples)


# ----------------------------------------------------------------------------- peak memory
# Measured, not calibrated: bench/memory_model.py counts the bytes of tensor storage alive in the
# trainer's own code op by op (what torch.cuda.max_memory_allocated reports), for one micro-batch of
# 1 and 2 layers: real tensors at rehearsal size, shape-only tensors at Qwen3 shapes (the same bytes
# where both run). docs/cluster.md, "Memory and time model", states the fit and its extrapolation;
# docs/measurements.md, "The trainer's memory model", the raw numbers. The whole paper step on
# shape-only tensors at 28 layers gave 69.3 / 82.0 GiB for the trainer code the H200 measured at
# 70.5 / 82.4 GiB, and 60.5 / 72.3 GiB for the code since (a micro-batch frees its tensors before
# the next one's forward), which this model gives to 0.01 GiB.

PROMPT_TOKENS = 120  # a Countdown chat prompt (the measured run's)
# Bytes kept for the backward per padded token and decoder layer: a linear form in the layer's widths
# (h hidden, i MLP, q = heads × head_dim, kv = kv_heads × head_dim) and head counts, exact on six width
# variants of Qwen3-0.6B and on Qwen3-1.7B (`bench/memory_model.py widths`). bf16: the linear layers'
# bf16 inputs and outputs, the norms' float32 inputs (autocast leaves them in float32).
LAYER_BYTES = {
    "bfloat16": dict(h=26, i=8, q=10, kv=10, heads=8, kv_heads=4, one=8),
    "float32": dict(h=24, i=16, q=16, kv=16, heads=8, kv_heads=4, one=8),
}
OUTSIDE_LAYERS_BYTES = dict(h=8, one=132)  # per padded token: the embedding's output, the final norm
# Bytes per response token and vocabulary entry of the head and the loss (float32 logits and
# log-softmax, their gradients; θ_s's log-distribution, q and the centred score's int64 one-hot where
# a correction reads them), the same in float32 and bf16 (`bench/memory_model.py logits`). `probe`: an
# on-policy probe's gradient (`Learner.pg_grad`); the others: the correction's gradient
# (`Learner.correction_grad`, θ_s's forward included). A correction not listed takes the largest.
LOGIT_BYTES = {"probe": 12, "pg": 20, "center": 33, "is": 20, "is_center": 33, "ppo": 20, "dlc": 36, "is_resync": 20,
               "tis": 20, "seq_tis": 20, "seq_mis": 20, "geo_rs": 20, "icepop": 20, "decoupled_ppo": 20, "center_tis": 44}
HEAD_INPUT_BYTES = {"bfloat16": 2, "float32": 4}  # × h per response token: the head's input (its dtype's bytes)
GPU_GIB = 139.8  # an H200 as torch.cuda reports it (the cost model's GPU)
GIB = 2**30


SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")


def param_count(arch: dict) -> int | None:
    """Parameters of a Qwen3-style decoder from its config.json (None: a shape key is missing):
    V·h embedding (twice without tie_word_embeddings) + L × (attention h·d·(2·heads + 2·kv_heads)
    [+ (heads + 2·kv_heads)·d biases] + q/k norms 2·d + MLP 3·h·i + two norms 2·h) + final norm h."""
    try:
        V, h, L, i, heads = (arch[k] for k in SHAPE_KEYS)
    except KeyError:
        return None
    kv = arch.get("num_key_value_heads") or heads
    d = arch.get("head_dim") or h // heads
    attention = h * d * (2 * heads + 2 * kv) + (heads + 2 * kv) * d * bool(arch.get("attention_bias"))
    layer = attention + 2 * d + 3 * h * i + 2 * h
    return V * h * (1 if arch.get("tie_word_embeddings") else 2) + L * layer + h


def layer_bytes(arch: dict, dtype: str) -> int:
    """Bytes kept per padded token by one decoder layer (LAYER_BYTES's linear form)."""
    h, i, heads = arch["hidden_size"], arch["intermediate_size"], arch["num_attention_heads"]
    kv_heads = arch.get("num_key_value_heads") or heads
    d = arch.get("head_dim") or h // heads
    c = LAYER_BYTES[dtype]
    widths = c["h"] * h + c["i"] * i + c["q"] * heads * d + c["kv"] * kv_heads * d
    return widths + c["heads"] * heads + c["kv_heads"] * kv_heads + c["one"]


def logit_bytes(correction: str) -> int:
    """LOGIT_BYTES of a correction (or `probe`), the largest for one not measured."""
    return LOGIT_BYTES.get(correction, max(LOGIT_BYTES.values()))


@dataclass(frozen=True)
class PeakMemory:
    """GiB of one training job at its peak, by part (`peak_memory`), at responses of
    `response_tokens`, `rows` sequences in the largest micro-batch."""

    params: int
    response_tokens: int
    rows: int
    weights: float
    gradients: float
    activations: float
    logits: float
    engines: float

    @property
    def trainer(self) -> float:
        return self.weights + self.gradients + self.activations + self.logits

    @property
    def total(self) -> float:
        return self.trainer + self.engines


def engines_per_job(cfg: Config) -> int:
    """Two engines (the run's and the BF16 probe engine), one where the sampler is that engine
    (`bf16`, always synced): the most any of the grid's samplers starts."""
    from .grid import get_sampler

    return max(1 if (s.precision == "bf16" and s.always_synced) else 2 for s in map(get_sampler, cfg.grid.samplers))


def micro_batch_rows(cfg: Config, model: str, response_tokens: int) -> int:
    """Sequences in a micro-batch of PROMPT_TOKENS + `response_tokens` each: micro_batch, or fewer
    where the batch is smaller or micro_batch_tokens holds fewer rows (at least one)."""
    t = cfg.train_for(model)
    fit = max(1, t.micro_batch_tokens // (PROMPT_TOKENS + response_tokens)) if t.micro_batch_tokens else t.micro_batch
    return min(t.micro_batch, t.prompts_per_step * t.responses_per_prompt, fit)


def peak_memory(cfg: Config, model: str, arch: dict, response_tokens: int = RESPONSE_TOKENS) -> PeakMemory | None:
    """A training job's peak memory (None: `arch`, the model's config.json, lacks a shape key): the
    worst of the grid's cells, in the correction's micro-batches of a probing step, every response
    `response_tokens` long. P parameters (`param_count`), L layers, hidden size h, vocabulary V; the
    largest micro-batch holds m rows (`micro_batch_rows`) of T = m·(PROMPT_TOKENS + R) padded and
    m·R response tokens:

        weights      4P × 3: θ_t, θ_s, θ_0 in float32 (+ 2P: the bf16 copies of θ_t that autocast
                     keeps for the backward; bfloat16 trainers only). Plain SGD keeps no state.
        gradients    4P × 3: g_on, g_on′ and the correction's running sum (+ 4P θ_before where a
                     correction takes updates_per_batch > 1 SGD steps).
        activations  T × (OUTSIDE_LAYERS_BYTES + L × `layer_bytes`).
        logits       m·R × (LOGIT_BYTES of the grid's worst correction × V + HEAD_INPUT_BYTES × h).
        engines      GPU: engines × gpu_memory_utilization × GPU_GIB (vLLM takes that share of the
                     card whatever the model; not measured); CPU: engines × (kv_cache_mib + 2P bytes
                     of bf16 weights).

    Measured (bench/memory_model.py): activations and logits are one micro-batch's, the rest counted.
    The micro-batch's flat gradient (8P at the end of its backward) is the larger only for
    micro-batches of a few hundred tokens, never at the paper's sizes."""
    from .registry import updates_per_batch

    P = param_count(arch)
    if P is None:
        return None
    t, e = cfg.train_for(model), cfg.engine
    dtype = cfg.models[model].trainer_dtype
    multi = any(updates_per_batch(c, t) > 1 for c in cfg.grid.corrections)
    m = micro_batch_rows(cfg, model, response_tokens)
    h, L, V = arch["hidden_size"], arch["num_hidden_layers"], arch["vocab_size"]
    k = max(logit_bytes(c) for c in cfg.grid.corrections)
    n = engines_per_job(cfg)
    gpu = job_resources(cfg, model)["gpu"] > 0
    outside = OUTSIDE_LAYERS_BYTES["h"] * h + OUTSIDE_LAYERS_BYTES["one"]
    return PeakMemory(
        params=P,
        response_tokens=response_tokens,
        rows=m,
        weights=P * (12 + 2 * (dtype == "bfloat16")) / GIB,
        gradients=4 * P * (3 + multi) / GIB,
        activations=m * (PROMPT_TOKENS + response_tokens) * (outside + L * layer_bytes(arch, dtype)) / GIB,
        logits=m * response_tokens * (k * V + HEAD_INPUT_BYTES[dtype] * h) / GIB,
        engines=n * e.gpu_memory_utilization * GPU_GIB if gpu else n * (e.kv_cache_mib * 2**20 + 2 * P) / GIB,
    )


def worst_peak_memory(cfg: Config, model: str, arch: dict) -> PeakMemory | None:
    """`peak_memory` at the response length, up to engine.max_tokens, that makes it largest:
    micro_batch_tokens bounds a micro-batch's padded tokens, so the worst is not always the longest
    responses (Qwen3-0.6B's: 16 rows of 450 tokens fill 9,120 as 7 rows of 1,024 do not)."""
    if param_count(arch) is None:
        return None
    return max((peak_memory(cfg, model, arch, r) for r in range(1, cfg.engine.max_tokens + 1)), key=lambda p: p.total)


def memory_line(cfg: Config, model: str, snapshot: Path | None) -> str:
    """The plan's line on a model's peak memory, from the config.json of its checkpoint."""
    arch = json.loads((snapshot / "config.json").read_text()) if snapshot else {}
    mem, worst = peak_memory(cfg, model, arch), worst_peak_memory(cfg, model, arch)
    if mem is None:
        why = "its config.json lacks the shape keys" if snapshot else "no complete checkpoint here to read config.json from"
        return f"  {model}: not estimated ({why})"
    gpu = job_resources(cfg, model)["gpu"] > 0
    n = engines_per_job(cfg)
    share = f"{n} x {cfg.engine.gpu_memory_utilization} of a {GPU_GIB} GiB H200" if gpu else f"{n} on CPU"
    card = f" of the card's {GPU_GIB}" if gpu else ""
    return (
        f"  {model}: {mem.params / 1e9:.2f} B params; trainer {mem.trainer:.1f} GiB (weights {mem.weights:.1f}, "
        f"flat gradients {mem.gradients:.1f}, activations {mem.activations:.1f}, logits {mem.logits:.1f}) "
        f"+ engines {mem.engines:.1f} GiB ({share}) = {mem.total:.1f} GiB; at worst {worst.total:.1f} GiB{card} "
        f"({worst.rows} responses of {worst.response_tokens} tokens per micro-batch, engine.max_tokens={cfg.engine.max_tokens})"
    )


# ----------------------------------------------------------------------------- the local cache


@dataclass(frozen=True)
class Need:
    """A model's weights or the task's data, and where they were found (or how to fetch them)."""

    key: str
    value: str
    found: Path | None
    problem: str = ""
    fix: str = ""
    built_here: bool = False  # the workflow makes it (the rehearsal's, paths.BUILT_HERE): never missing
    readers: tuple[str, ...] = ()  # the grid's models whose training jobs read it


# A checkpoint's weights: one file, or shards listed in the file's `.index.json` weight_map
# (safetensors first; a local directory may hold PyTorch's format).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def checkpoint_problem(d: Path) -> str:
    """"" when `d` holds a complete checkpoint: config.json and the weights (model.safetensors, or
    model.safetensors.index.json with every shard its weight_map names; the same for
    pytorch_model.bin), else what is missing.

    In a hub cache snapshot each file is a symlink into the repo's blobs/, made once the file has
    arrived; a download that stopped leaves shards absent (or links dangling) and its partial
    blob as blobs/*.incomplete, which `huggingface-cli download` resumes."""
    missing = [] if (d / "config.json").exists() else ["config.json"]
    for name in WEIGHT_FILES:
        index = d / f"{name}.index.json"
        if (d / name).exists():
            break
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            absent = [s for s in shards if not (d / s).exists()]  # exists() is False for a dangling link
            if absent:
                missing.append(f"{len(absent)} of {len(shards)} shards of {index.name} ({', '.join(absent)})")
            break
    else:
        missing.append(f"the weights ({' or '.join(f'{n}[.index.json]' for n in WEIGHT_FILES)})")
    if not missing:
        return ""
    if d.parent.name != "snapshots":  # a local directory, not a download
        return f"incomplete checkpoint at {d}: missing {'; '.join(missing)}"
    partial = list((d.parents[1] / "blobs").glob("*.incomplete"))
    held = f"; blobs/ holds {len(partial)} partial file(s) (*.incomplete)" if partial else ""
    return f"incomplete download at {d}: missing {'; '.join(missing)}{held}; rerunning the download resumes it"


def needs(cfg: Config) -> list[Need]:
    """What the grid's jobs read from disk and do not build: each `hf` model's weights (read by that
    model's jobs) and a parquet task's data (read by every job), found as a local path or in the
    Hugging Face cache (never downloaded)."""
    models = tuple(dict.fromkeys(cfg.grid.models))
    items = [(f"models.{m}.path", cfg.models[m].path, "model", (m,)) for m in models if cfg.models[m].kind == "hf"]
    if cfg.task.source == "parquet":
        items.append(("task.path", cfg.task.path, "dataset", models))
    return [Need(key, value, **_find(key, value, kind), readers=readers) for key, value, kind, readers in items]


def _find(key: str, value: str | None, kind: str) -> dict[str, Any]:
    """A need's `found`, `problem` ("" if none), `fix` (the line that fetches it) and `built_here`."""
    from .paths import BUILT_HERE, NotCached, resolve_local

    if not value:  # the schema allows it; validate() refuses it, but the Snakefile only builds
        what = "for kind 'hf'" if kind == "model" else "when task.source is 'parquet'"
        return dict(found=None, problem=f"{key} is required {what}: a local path or a Hugging Face id")
    flag = " --repo-type dataset" if kind == "dataset" else ""
    fix = f"huggingface-cli download{flag} {value}" if "/" in value and not Path(value).is_absolute() else ""
    try:
        found = resolve_local(value, kind, key)
    except NotCached as e:
        built = value in BUILT_HERE
        return dict(found=None, built_here=True) if built else dict(found=None, problem=e.problem, fix=fix)
    if kind == "model":
        return dict(found=found, problem=checkpoint_problem(found), fix=fix)
    has_data = any(found.rglob("*.parquet")) or found.suffix == ".parquet"
    no_data = f"found at {found} but without parquet files: an interrupted download?"
    return dict(found=found, problem="" if has_data else no_data, fix=fix)


def finished(cfg: Config, cell: Cell) -> bool:
    """A cell whose run is done: its summary.json, written last, is in its results directory."""
    return (Path(cfg.results_dir) / cell.name / "summary.json").exists()


def blocking(cfg: Config, found: list[Need]) -> list[Need]:
    """The missing needs (of `found`) that a job still to run reads: a trained cell without its
    summary.json loads its model's weights and the task's data; a finished cell and a cell that
    copies another's run load nothing."""
    waiting = {c.model for c in grid_cells(cfg) if c.same_as is None and not finished(cfg, c)}
    return [n for n in found if n.problem and waiting.intersection(n.readers)]


def missing_message(cfg: Config) -> str:
    """The missing weights and data that a cell still to run needs (`blocking`), with the line that
    fetches each; "" when nothing is missing or only finished cells would have read it."""
    from .paths import hf_hub_cache

    bad = blocking(cfg, needs(cfg))
    if not bad:
        return ""
    lines = [f"missing from this machine's Hugging Face cache ({hf_hub_cache()}); fetch on a login node, then rerun:"]
    for n in bad:
        lines.append(f"  {n.key}={n.value}: {n.problem}" + (f"\n    {n.fix}" if n.fix else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the plan


def gpu_minutes(resources: dict[str, int]) -> int:
    return resources["gpu"] * resources["runtime"]


def _hours(minutes: float) -> str:
    return f"{minutes / 60:.1f}"


def plan_text(cfg: Config, source: str = "") -> str:
    """The plan: cells trained vs copied, GPU-hours requested (Σ runtime × GPUs) and estimated by
    the cost model per model, the largest single job, and the weights and data the jobs read."""
    from .paths import hf_hub_cache

    cells = grid_cells(cfg)
    g = cfg.grid
    lines = [
        f"dlcrepro plan: {cfg.name}" + (f" ({source})" if source else ""),
        f"grid: {len(g.models)} models x {len(g.samplers)} samplers x {len(g.corrections)} corrections x {len(g.seeds)} seeds"
        f" = {len(cells)} cells: {sum(c.same_as is None for c in cells)} trained, {sum(c.same_as is not None for c in cells)} copied"
        " (a copy waits for the cell it equals and asks for no GPU)",
    ]
    warm = [m for m in dict.fromkeys(g.models) if cfg.models[m].kind == "tiny"]
    if warm:
        lines.append(f"warm start: {len(warm)} CPU job(s) first ({', '.join(warm)})")
    shared = rollouts_jobs(cfg)
    if shared:
        lines.append(f"shared rollouts: {len(shared)} job(s) first, one per lagged sampler and seed: the batches its cells "
                     "sample from θ_0, sampled once (dlcrepro/rollouts.py); counted in the GPU-hours below")
    initial = initial_eval_jobs(cfg)
    if initial:
        lines.append(f"θ_0 evaluations: {len(initial)} job(s) first, one per model and seed: θ_0's accuracies, where every "
                     "cell's curve starts, evaluated once (dlcrepro/initial_eval.py); counted in the GPU-hours below")
    def row(*cols) -> str:
        return "{:<12}{:>6}{:>9}{:>8}{:>6}  {:<22}{:>16}  {}".format(*cols)

    lines += ["", row("model", "cells", "trained", "copied", "done", "each trained job", "GPU-h requested", "GPU-h estimated")]
    total_req, total_est, largest = 0.0, 0.0, None
    for m in dict.fromkeys(g.models):
        mine = [c for c in cells if c.model == m]
        trained = [c for c in mine if c.same_as is None]
        done = sum(finished(cfg, c) for c in mine)
        r = job_resources(cfg, m)
        requested = sum(gpu_minutes(job_resources(cfg, m, c.same_as is not None)) for c in mine)
        est = estimated_minutes(cfg, m)
        est_gpu = None if est is None else est * r["gpu"] * len(trained)
        for _, sampler, seed in (j for j in shared if j[0] == m):  # each rollouts job, and the cells that read it
            requested += gpu_minutes(rollouts_job_resources(cfg, m, sampler))
            if est_gpu is not None:
                readers = [c for c in trained if c.sampler == sampler and c.seed == seed and not correction_info(c.correction).resync]
                # a resync correction reads the file only until its first resync: counted as sampling it all
                est_gpu += r["gpu"] * (rollouts_minutes(cfg, m, sampler) - len(readers) * shared_sampling_minutes(cfg, m, sampler))
        for _ in (j for j in initial if j[0] == m):  # each θ_0 evaluation job
            requested += gpu_minutes(initial_eval_job_resources(cfg, m))
            if est_gpu is not None:
                est_gpu += r["gpu"] * initial_eval_minutes(cfg, m)
        per_job = f"{r['gpu']} GPU, {r['runtime']} min, {r['mem_mb'] // 1000} GB"
        est_text = "—" if est_gpu is None else f"{_hours(est_gpu)} ({est:.0f} min/job)"
        lines.append(row(m, len(mine), len(trained), len(mine) - len(trained), done, per_job, _hours(requested), est_text))
        total_req += requested
        total_est += est_gpu or 0
        key = (gpu_minutes(r), r["runtime"], r["mem_mb"])
        if trained and (largest is None or key > largest[0]):
            largest = (key, trained[0], r, len(trained))
    n_trained = sum(c.same_as is None for c in cells)
    lines.append(row("total", len(cells), n_trained, len(cells) - n_trained, "", "", _hours(total_req), _hours(total_est)))
    lines.append("GPU-h requested: Σ runtime × GPUs of the Slurm requests; estimated: the H200 cost model of docs/cluster.md (— where a model is not in it)")
    if largest:
        _, cell, r, n = largest
        lines.append(
            f"largest single job: train {cell.name} (and {n - 1} like it): {r['gpu']} GPU, {r['runtime']} min, "
            f"{r['mem_mb']} MB, {r['cpus_per_task']} CPUs"
        )
    found = needs(cfg)
    checkpoints = {n.readers[0]: n.found for n in found if n.key.startswith("models.") and not n.problem}
    hf = [m for m in dict.fromkeys(g.models) if cfg.models[m].kind == "hf"]
    if hf:
        lines += ["", f"peak memory of a job (cluster.peak_memory: measured per micro-batch, docs/cluster.md; "
                      f"{PROMPT_TOKENS}-token prompts, {RESPONSE_TOKENS}-token responses):"]
        lines += [memory_line(cfg, m, checkpoints.get(m)) for m in hf]
    lines += ["", f"weights and data (Hugging Face cache {hf_hub_cache()}):"]
    for m in warm:
        lines.append(f"  models.{m}: built here by the warm start ({Path(cfg.artifacts) / m / 'model'})")
    if cfg.task.source != "parquet":
        lines.append("  task: generated here (task.source: generate)")
    needed = blocking(cfg, found)
    for n in found:
        if n.built_here and n.found is None:
            lines.append(f"  {n.key}={n.value}: built here first (rule rehearsal_assets: python -m dlcrepro rehearsal)")
        elif not n.problem:
            lines.append(f"  {n.key}={n.value}: ok ({n.found})")
        else:
            unused = "" if n in needed else " (no cell left to run reads it: its cells are finished)"
            lines.append(f"  {n.key}={n.value}: MISSING{unused}: {n.problem}" + (f"; fix: {n.fix}" if n.fix else ""))
    return "\n".join(lines)


def load_merged(paths: list[str], overrides: dict[str, Any] | None = None) -> Config:
    """Config files merged in order as Snakemake merges `--configfile`s (nested keys updated; a
    file with a `base` key laid over its base first), then dotted overrides; built (ranges
    checked) without importing torch."""
    from .config import build, read_layers

    return build(read_layers(paths, overrides))
