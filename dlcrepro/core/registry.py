"""The names of the corrections and what the workflow must know of each, without torch.

This is the one list every part of the harness reads: the config check (`config.build` refuses a
name not here, naming the known ones), the Snakefile (which imports no torch), `analysis`
(which runs resync), and `corrections` (whose registered functions must match it one to one:
tests/test_corrections_practice.py fails when they disagree). Adding a correction is one entry here and one
function in `corrections.py` decorated with `@register_correction("name")`; the grid, the tables
and the figures then take it by name.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownNameError(KeyError):
    """A name nothing registers: a sampler, a correction or a model a user typed (a wildcard, an
    option). The command line reports it in one line, where an internal KeyError keeps its traceback;
    a KeyError still, for code that looks a name up."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # KeyError's own str() quotes the message


@dataclass(frozen=True)
class CorrectionInfo:
    """What the workflow must know of a correction before any tensor exists."""

    name: str
    # one line for tables and docs: the per-token gradient term.
    term: str
    # resynchronize the sampler when the lag ESS of a fresh batch falls below train.resync_ess.
    resync: bool = False
    # the loss depends on θ_old (PPO-style): several SGD steps per batch (`updates_per_batch` below).
    multi_update: bool = False
    # a multi_update correction's SGD steps per batch: None takes train.updates_per_batch; a number is
    # the correction's own, so a variant with more steps (ppo_multi) shares one grid config with the
    # other cells (train.updates_per_batch is global).
    updates_per_batch: int | None = None
    # the loss reads the engine's next-token distribution q (its top-k log-probs).
    needs_q: bool = False
    # the loss reads whole sequences (TokenTerms.seq): a sequence-level ratio, mask or mean. For the
    # reader only: every micro-batch holds whole sequences (TokenBatch.chunks), so no code path
    # branches on it; a batch split inside a sequence would break these corrections.
    needs_sequences: bool = False
    # the family the figures draw in one hue, its members apart by line style and marker
    # (figures.correction_styles); "" = a family of its own.
    family: str = ""


def _infos(*infos: CorrectionInfo) -> dict[str, CorrectionInfo]:
    out: dict[str, CorrectionInfo] = {}
    for i in infos:
        if i.name in out:
            raise ValueError(f"registry: correction {i.name!r} listed twice")
        if i.updates_per_batch is not None and not (i.multi_update and i.updates_per_batch >= 1):
            raise ValueError(f"registry: correction {i.name!r}: updates_per_batch needs multi_update and a count >= 1")
        out[i.name] = i
    return out


CORRECTION_INFO: dict[str, CorrectionInfo] = _infos(
    # the paper's five, and the two controls its tables compare against
    CorrectionInfo("pg", "A·∇ℓ(y)", family="no correction"),
    CorrectionInfo("center", "A·c(y), q̃ = q", needs_q=True, family="centred"),
    CorrectionInfo("is", "exp(b − e)·A·∇ℓ(y)", family="token IS"),
    CorrectionInfo("is_center", "exp(b − a)·A·c(y), q̃ ∝ q·exp(λ)", needs_q=True, family="centred"),
    CorrectionInfo("ppo", "PPO clip of π_θ/π_old", multi_update=True, family="no correction"),
    # the paper's PPO read as several SGD steps per batch, the batch reused (F7 measured, not pg's). The paper
    # gives no count: 4 is an assumption, verl's default ratio of rollout batch to mini-batch (docs/method.md#ppo_multi)
    CorrectionInfo("ppo_multi", "PPO clip of π_θ/π_old, 4 SGD steps per batch", multi_update=True, updates_per_batch=4,
                   family="several SGD steps per batch"),
    CorrectionInfo("dlc", "min(exp(b − a), C)·A·c(y), q̃ ∝ q·min(exp(λ), C); resync", resync=True, needs_q=True,
                   family="DLC, the paper's"),
    CorrectionInfo("is_resync", "exp(b − e)·A·∇ℓ(y); resync", resync=True, family="token IS"),
    # the corrections practitioners run with a vLLM sampler
    CorrectionInfo("tis", "min(exp(b − e), C)·A·∇ℓ(y)", family="token IS"),
    CorrectionInfo("seq_tis", "min(ρ_seq, C_seq)·A·∇ℓ(y)", needs_sequences=True, family="sequence IS"),
    CorrectionInfo("seq_mis", "1[L ≤ ρ_seq ≤ C_seq]·ρ_seq·A·∇ℓ(y), mean over kept tokens", needs_sequences=True,
                   family="sequence IS"),
    CorrectionInfo("geo_rs", "1[geometric-mean ratio in bounds]·A·∇ℓ(y), mean over kept tokens", needs_sequences=True,
                   family="sequence IS"),
    CorrectionInfo("icepop", "1[α ≤ exp(old − e) ≤ β]·exp(old − e)·PPO clip of π_θ/π_old", multi_update=True,
                   family="PPO with a token mask"),
    CorrectionInfo("decoupled_ppo", "1[exp(old − e) ≤ cap]·exp(old − e)·PPO clip of π_θ/π_old", multi_update=True,
                   family="PPO with a token mask"),
    CorrectionInfo("center_tis", "A·[w(y)∇ℓ(y) − Σ_v q(v)w(v)∇ℓ(v)], w = min(π/q, C)", needs_q=True, family="centred"),
    CorrectionInfo("gspo", "clip of s_i = exp(mean_seq(b − old))·A·∇ℓ(y)/|y_i|, sequence mean; 4 SGD steps per batch",
                   multi_update=True, updates_per_batch=4, needs_sequences=True, family="several SGD steps per batch"),
)


def correction_info(name: str) -> CorrectionInfo:
    if name not in CORRECTION_INFO:
        raise UnknownNameError(f"unknown correction {name!r}; known: {sorted(CORRECTION_INFO)}")
    return CORRECTION_INFO[name]


def updates_per_batch(name: str, train) -> int:
    """The SGD steps correction `name` takes on each sampled batch under a `train` config
    (config.TrainConfig): 1 unless it is multi_update; then its own count if the registry gives
    one, else train.updates_per_batch."""
    info = correction_info(name)
    if not info.multi_update:
        return 1
    return info.updates_per_batch if info.updates_per_batch is not None else train.updates_per_batch


def engine_topk(name: str, engine) -> int:
    """The top-k next-token log-probs the engine returns for correction `name` under an `engine`
    config (config.EngineConfig): engine.topk where its loss reads the engine's distribution q,
    else 0 (~20 % of a tiny-model sampling call; on Qwen3 the (N, V) q is the trainer's largest
    tensor). What a cell samples with and what its shared rollouts must hold."""
    return engine.topk if correction_info(name).needs_q else 0


def resync_corrections() -> tuple[str, ...]:
    """The corrections that resynchronize their sampler (the tables split runs by it)."""
    return tuple(n for n, c in CORRECTION_INFO.items() if c.resync)
