"""The peak memory of a training job, by part: the trainer's bytes measured per micro-batch
(bench/memory_model.py) and the engines' share of the card."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.config import Config
from ..core.grid import get_sampler
from ..core.registry import updates_per_batch
from .costs import RESPONSE_TOKENS
from .resources import job_resources

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
# (`Learner.correction_grad`: θ_s's forward only for a correction that reads its distribution, the
# centred ones and dlc; the others 20 before it was computed on demand, 16 since: 2026-12-05, session
# 14, docs/measurements.md). A correction not listed takes the largest.
# ppo_multi is ppo's loss (corrections.ppo), one gradient at a time over its SGD steps: ppo's bytes.
LOGIT_BYTES = {"probe": 12, "pg": 16, "center": 33, "is": 16, "is_center": 33, "ppo": 16, "dlc": 36, "is_resync": 16,
               "tis": 16, "seq_tis": 16, "seq_mis": 16, "geo_rs": 16, "icepop": 16, "decoupled_ppo": 16, "center_tis": 44}
LOGIT_BYTES["ppo_multi"] = LOGIT_BYTES["ppo"]
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
    (Sampler.is_probe_engine): the most any of the grid's samplers starts."""
    return max(1 if s.is_probe_engine else 2 for s in map(get_sampler, cfg.grid.samplers))


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

