"""The weight-sync load manifest: what a reload put into the engine, compared with what the trainer holds.

At every push the engine's worker reports (`reload_with_manifest`) which of its model's parameters
received tensors in that reload and a fingerprint of every checkpoint-named slice of them, read after
vLLM's post-load processing; `problems` compares that with the fingerprints of the tensors the
trainer means the engine to hold (`fingerprints`, computed the same way on the trainer's tensors after
the precision's transform). Statistics of sampled tokens cannot tell a layer left at an old version
from a correct one (docs/method.md, "The load manifest"); this can.

The fingerprint of a tensor T `(R, C)` (1-D: `(R, 1)`) is u_R · (T v_C) in float64, with u_R and v_C
fixed pseudo-random vectors of lengths R and C, entries in [-1, 1). A fused vLLM parameter (qkv_proj:
q, k, v stacked along rows; gate_up_proj: gate, up) is sliced by rows into its checkpoint names, so
the engine's slice and the trainer's tensor get the same u and v. Two tensors whose values differ
anywhere give different fingerprints (for random u, v, a nonzero difference projects to zero with
probability 0); the same values give the same float64 sums up to their rounding (`TOLERANCE`).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import torch

# Row products are kept on a linear layer at vLLM's CPU dispatch (`record_row_products`): where oneDNN,
# AMX or zentorch pack the weight, vLLM then replaces `layer.weight` by an empty tensor (layers/utils.py,
# dispatch_cpu_unquantized_gemm, remove_weight=True), and the packed copy cannot be read back.
ROWS_ATTR = "dlcrepro_row_products"
# Two fingerprints agree when they differ by at most this times the sum of |u_i (T v)_i|: the float64
# rounding of sums of up to ~10^6 terms is ~10^-13 of it; one BF16 unit changed in one weight of a
# 128 x 128 matrix moves the fingerprint ~10^4 times this bound.
TOLERANCE = 1e-9
CHUNK_ELEMENTS = 2**22  # rows are projected in chunks of about this many elements (float64 copies of 32 MiB)


@dataclass(frozen=True)
class Fingerprint:
    """u · (T v) of a tensor, and the scale its rounding is measured against: Σ |u_i (T v)_i|."""

    value: float
    scale: float

    def matches(self, other: "Fingerprint") -> bool:
        return abs(self.value - other.value) <= TOLERANCE * max(self.scale, other.scale)


@lru_cache(maxsize=256)
def _projection(n: int, which: int) -> torch.Tensor:
    """A fixed `(n,)` float64 vector, entries uniform in [-1, 1): the same in every process."""
    g = torch.Generator().manual_seed(0x5EED0 + 2 * n + which)
    return torch.rand(n, generator=g, dtype=torch.float64).mul_(2).sub_(1)


def row_products(t: torch.Tensor) -> torch.Tensor:
    """`(R,)` float64 T v_C of a tensor `(R, ...)` (flattened to `(R, C)`; 1-D: `(R, 1)`), on the CPU."""
    t2 = t.detach().reshape(t.shape[0], -1)
    v = _projection(t2.shape[1], 1).to(t2.device)
    step = max(1, CHUNK_ELEMENTS // max(1, t2.shape[1]))
    return torch.cat([t2[i : i + step].double() @ v for i in range(0, t2.shape[0], step)]).cpu()


def fingerprint_of_rows(rows: torch.Tensor) -> Fingerprint:
    """The fingerprint of a tensor from its `(R,)` row products."""
    ur = _projection(rows.numel(), 0) * rows
    return Fingerprint(float(ur.sum()), float(ur.abs().sum()))


def fingerprints(state: dict[str, torch.Tensor]) -> dict[str, Fingerprint]:
    """The fingerprint of each tensor of a state dict (the trainer's side)."""
    return {k: fingerprint_of_rows(row_products(v)) for k, v in state.items()}


def record_row_products(layer: torch.nn.Module) -> None:
    """Keep the row products of `layer.weight` on the layer: called by vLLM's CPU linear dispatch just
    before it builds the kernel from the weight (and may drop the weight)."""
    w = getattr(layer, "weight", None)
    if w is not None and w.numel() and not w.is_meta:
        setattr(layer, ROWS_ATTR, row_products(w))


# --------------------------------------------------------------------------- the engine's side


def _checkpoint_names(model: torch.nn.Module) -> dict[str, tuple[str, int, int]]:
    """Checkpoint name -> (engine parameter name, shard index, shard count) for every engine
    parameter, tied aliases included: a fused parameter (`packed_modules_mapping`, e.g. qkv_proj ->
    q_proj, k_proj, v_proj) gives one name per shard, any other its own name."""
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    out = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        module_name, _, pname = name.rpartition(".")
        parent, _, leaf = module_name.rpartition(".")
        parts = packed.get(leaf, [leaf])
        for i, sub in enumerate(parts):
            out[f"{parent}.{sub}.{pname}" if parent else f"{sub}.{pname}"] = (name, i, len(parts))
    return out


def _readable_rows(model: torch.nn.Module, name: str) -> torch.Tensor | None:
    """`(R,)` row products of an engine parameter as it holds it now: from the tensor itself, or,
    where vLLM's CPU dispatch dropped it (empty), those recorded when the kernel was built in this
    reload; None if neither (the layer was not processed in this reload)."""
    module_name, _, pname = name.rpartition(".")
    module = model.get_submodule(module_name)
    t = module.get_parameter(pname)
    if t.numel():
        return row_products(t)
    return getattr(module, ROWS_ATTR, None) if pname == "weight" else None


def _shard_rows(module: torch.nn.Module, total: int, index: int, count: int) -> tuple[int, int]:
    """(first row, rows) of shard `index` of `count` in a parameter of `total` rows: a fused linear
    layer's shards by its `output_sizes` (scaled to the parameter's rows: a block scale has one row
    per 128); an embedding's real vocabulary, without vLLM's padding rows."""
    if count == 1:
        return 0, min(total, getattr(module, "org_vocab_size", total))
    sizes = list(module.output_sizes)
    unit = total / sum(sizes)
    return round(sum(sizes[:index]) * unit), round(sizes[index] * unit)


def _engine_shape(model: torch.nn.Module, param: str, index: int, count: int) -> tuple[int, ...]:
    """The shape of the checkpoint tensor shard `index` of `count` of an engine parameter takes;
    a linear weight that vLLM's CPU dispatch dropped has the layer's (output_size, input_size)."""
    module_name, _, pname = param.rpartition(".")
    module = model.get_submodule(module_name)
    t = module.get_parameter(pname)
    shape = tuple(t.shape) if t.numel() else (module.output_size, module.input_size)
    return (_shard_rows(module, shape[0], index, count)[1], *shape[1:])


@dataclass
class Manifest:
    """What one reload did, reported by the engine's worker.

    received: engine parameters that received a tensor (vLLM's `load_weights` return value).
    not_received: engine parameters (tied aliases resolved) that did not.
    unknown: sent names that no engine parameter takes, or whose shape it does not have (nothing
      was reloaded then: vLLM would raise halfway, its layers left on the meta device).
    fingerprints: per checkpoint name, the engine's slice after post-load processing.
    unreadable: engine parameters with no readable value (a layer not processed in this reload).
    warnings: what vLLM logged at WARNING or above during the reload.
    reload_seconds: vLLM's reload itself (with the row products kept at its CPU dispatch).
    """

    received: list[str] = field(default_factory=list)
    not_received: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    fingerprints: dict[str, Fingerprint] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reload_seconds: float = 0.0


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


@contextmanager
def vllm_warnings():
    """vLLM's warnings in the block, collected (the engine runs vLLM's loggers at ERROR:
    VLLM_LOGGING_LEVEL in engine.py, for its start-up chatter; a reload's warnings are wanted)."""
    logger = logging.getLogger("vllm")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(min(level, logging.WARNING) if level else logging.WARNING)
    try:
        yield handler.lines
    finally:
        logger.setLevel(level)
        logger.removeHandler(handler)


def reload_with_manifest(worker, sent: dict[str, torch.Tensor]) -> Manifest:
    """(Runs in vLLM's worker.) Reload `sent` in place, in checkpoint format (vLLM re-runs each
    layer's post-load processing), and report what arrived. Sent names that no engine parameter
    takes, or takes in another shape, stop it before anything is reloaded."""
    model = worker.model_runner.get_model()
    names = _checkpoint_names(model)
    unknown = sorted(k for k in sent if k not in names)
    unknown += sorted(f"{k} {tuple(t.shape)} (the engine's is {shape})" for k, t in sent.items()
                      if k in names and (shape := _engine_shape(model, *names[k])) != tuple(t.shape))
    if unknown:
        return Manifest(unknown=unknown)
    for module in model.modules():  # a layer this reload does not process must not show old row products
        if hasattr(module, ROWS_ATTR):
            delattr(module, ROWS_ATTR)
    received: set[str] = set()
    vllm_load = model.load_weights

    def load_and_record(weights):
        loaded = vllm_load(weights)
        received.update(loaded or ())
        return loaded

    model.load_weights = load_and_record  # reload_weights discards what load_weights returns
    t = time.perf_counter()
    try:
        with vllm_warnings() as warnings:
            worker.model_runner.reload_weights(weights_iterator=list(sent.items()), is_checkpoint_format=True)
    finally:
        del model.load_weights
    got = {id(model.get_parameter(n)) for n in received}
    out = Manifest(received=sorted(received), warnings=warnings, reload_seconds=time.perf_counter() - t)
    out.not_received = [n for n, p in model.named_parameters() if id(p) not in got]
    rows_of: dict[str, torch.Tensor | None] = {}
    for ckpt, (param, index, count) in names.items():
        if param not in rows_of:
            rows_of[param] = _readable_rows(model, param)
        rows = rows_of[param]
        if rows is None:
            out.unreadable.append(param)
            continue
        first, n = _shard_rows(model.get_submodule(param.rpartition(".")[0]), rows.numel(), index, count)
        out.fingerprints[ckpt] = fingerprint_of_rows(rows[first : first + n])
    out.unreadable = sorted(set(out.unreadable))
    return out


# --------------------------------------------------------------------------- the comparison


def _named(what: str, names: list[str], limit: int = 24) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{what}: {', '.join(names[:limit])}{more}"


def problems(m: Manifest, sent: dict[str, torch.Tensor], expected: dict[str, Fingerprint]) -> list[str]:
    """What is wrong with a reload, one line per kind, naming the parameters ([] if nothing):
    sent tensors no engine parameter took, engine parameters that received none, tensors the
    trainer holds but did not send, and checkpoint names whose engine slice's fingerprint is not the
    trainer's (`expected`: checkpoint name -> fingerprint of what the engine should hold)."""
    if m.unknown:
        return [_named("sent tensors no engine parameter takes in their name and shape (nothing was reloaded)",
                       m.unknown)]
    out = []
    if m.not_received:
        out.append(_named("engine parameters that received no tensor in this reload (they keep their previous values)",
                          m.not_received))
    if m.unreadable:
        out.append(_named("engine parameters whose layer was not processed in this reload", m.unreadable))
    missing = sorted(k for k in expected if k not in sent)
    if missing:
        out.append(_named("tensors the trainer holds but did not send", missing))
    off = [k for k, want in expected.items() if k in m.fingerprints and not m.fingerprints[k].matches(want)]
    if off:
        out.append(_named("engine tensors whose fingerprint is not the trainer's (other values, shape or place)", off))
    return out
