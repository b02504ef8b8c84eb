"""The rehearsal of the paper path: a Qwen3 checkpoint and a Countdown data set made here, in the
Hugging Face cache exactly as `huggingface-cli download` leaves Qwen/Qwen3-0.6B and
Jiayi-Pan/Countdown-Tasks-3to4 (`models--org--name/{refs/main, snapshots/<commit>/, blobs/}`), so
that a paper job (`kind: hf`, found by id, a byte-level BPE tokenizer, Qwen3's chat template with
thinking disabled, parquet data, top-k far below the vocabulary, responses of tens of tokens)
runs end to end on a CPU (`configs/rehearsal.yaml`).

What is real: the model class (`Qwen3ForCausalLM`, GQA, q/k norms, head_dim 128, tied
embeddings), the tokenizer library and file format, the chat template's rendering, the cache
layout and the parquet columns, and the files' form: config.json, tokenizer_config.json and
generation_config.json as Qwen/Qwen3-0.6B's are written (`hub_config`, `save_tokenizer`). What
is scaled down: the sizes (`REHEARSAL_ARCH`, ~2 M parameters against 0.6 B) and the data
(solver-made problems of 3 and 4 numbers, not the published rows).
The recipe lives here, not in a config, as a downloaded checkpoint's does on its model card.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..step import countdown
from ..core.arch import QWEN3_COMMON
from ..core.config import WarmstartConfig
from ..step.countdown import Problem
from ..core.paths import REHEARSAL_DATASET, REHEARSAL_MODEL, cache_repo_dir, hf_hub_cache
from ..core.util import log

# Qwen3's architecture (`arch.QWEN3_COMMON`: grouped-query attention with head_dim 128, q/k norms, its
# rope θ and norm ε, tied embeddings) with Qwen3-0.6B's sizes (28 layers, hidden 1024, 16 query / 8
# key-value heads, MLP 3072, vocabulary 151,936) cut to what 2 CPU cores train in minutes: every matrix
# still holds several 128 x 128 FP8 blocks (q_proj and o_proj 4 each, k/v_proj 2, gate/up/down 8), so
# native and emulated block FP8 quantize real blocks; the vocabulary stays far above the paper config's
# top-k of 20. 4 layers of 4 heads and MLP 768 took 9-12 s per warm-start step (32 x 141 tokens) on 2
# shared cores: this shape is ~3x cheaper.
REHEARSAL_ARCH = dict(
    QWEN3_COMMON,
    vocab_size=3072,  # the tokenizer's 3,002 entries padded to a multiple of 128, as Qwen3 pads its own
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=2048,
    max_window_layers=2,  # Qwen3 writes its layer count here (28 of 28); unread without a sliding window
)
TOKENIZER_SIZE = 3000

# Qwen3's special tokens, in its order; `<think>`/`</think>` are added tokens that decoding keeps.
ENDOFTEXT, IM_START, IM_END, THINK, END_THINK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ADDED_TOKENS = (THINK, END_THINK)

# Written for this project. Renders messages as Qwen3's template does, and with
# `enable_thinking=False` opens the assistant turn with an empty think block, as Qwen3's does.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# The keys of Qwen/Qwen3-0.6B's config.json, exactly: written by transformers 4.51 (`rope_theta`, `rope_scaling`,
# `torch_dtype`). transformers 5 writes `rope_parameters` and `dtype` instead, a form no downloaded Qwen3 has;
# both libraries convert the old keys on reading (docs/rehearsal.md, "The files' form").
QWEN3_CONFIG_KEYS = (
    "architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
    "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "max_window_layers", "model_type",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
    "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "use_sliding_window",
    "vocab_size",
)
# Qwen3's generation_config.json: its recommended sampling for thinking mode. Every engine call passes its own
# SamplingParams (engine.py), which these never reach: tests/test_rehearsal.py samples with and without them.
QWEN3_SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}

# Qwen2/Qwen3's pre-tokenizer split: letters in words, each digit alone (so numbers are read digit
# by digit), punctuation runs, new lines, spaces.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The data set: 3-number problems (numbers 1-15, targets 1-50) and 4-number ones (numbers 1-8,
# targets 1-40), shuffled together as Countdown-Tasks-3to4 mixes 3 and 4 numbers; small numbers, so
# that a model of ~2 M parameters warm-started in minutes gets some right.
DATASET_ROWS = {3: 6400, 4: 6400}
DATASET_RANGES = {3: ((1, 15), (1, 50)), 4: ((1, 8), (1, 40))}
DATASET_SEED = 2026

# The warm start: supervised training on worked answers (`countdown.worked_answer`).
REHEARSAL_WARMSTART = WarmstartConfig(steps=300, batch=32, lr=3e-3, lr_final=0.1, warmup_steps=50, seed=0)
REHEARSAL_TEST_PROBLEMS = 256  # greedy accuracy measured on the rows after the training rows


# ----------------------------------------------------------------------------- the cache layout


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_snapshot(src: Path, repo_id: str, kind: str, cache: Path) -> Path:
    """Lay the files of directory `src` into `cache` as the hub client does: each file a blob named
    by its hash, the snapshot `snapshots/<commit>/` of relative symlinks to them, and `refs/main`
    naming the commit. The commit is a hash of the files' names and contents, so the same files
    give the same snapshot. Returns the snapshot directory."""
    repo = cache_repo_dir(cache, repo_id, kind)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    digests = {p.relative_to(src).as_posix(): _sha256(p) for p in files}
    commit = hashlib.sha1(json.dumps(digests, sort_keys=True).encode()).hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    tmp_snap = repo / "snapshots" / f".{commit}.tmp"
    shutil.rmtree(tmp_snap, ignore_errors=True)
    for rel, digest in digests.items():
        blob = repo / "blobs" / digest
        if not blob.exists():
            shutil.copyfile(src / rel, blob.with_suffix(".incomplete"))
            blob.with_suffix(".incomplete").replace(blob)
        link = tmp_snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    shutil.rmtree(snap, ignore_errors=True)
    tmp_snap.replace(snap)
    (repo / "refs").mkdir(exist_ok=True)
    ref_tmp = repo / "refs" / "main.tmp"
    ref_tmp.write_text(commit)
    ref_tmp.replace(repo / "refs" / "main")  # last: the snapshot is whole before anything names it
    return snap


# ----------------------------------------------------------------------------- the data set


def rehearsal_problems() -> list[Problem]:
    """The data set's rows: solvable 3- and 4-number problems, shuffled together (deterministic)."""
    parts = [
        countdown.generate(rows, seed=DATASET_SEED + k, num_numbers=k, number_range=DATASET_RANGES[k][0],
                           target_range=DATASET_RANGES[k][1])
        for k, rows in DATASET_ROWS.items()
    ]
    rows = [p for part in parts for p in part]
    order = np.random.default_rng(DATASET_SEED).permutation(len(rows))
    return [rows[i] for i in order]


def write_dataset(cache: Path) -> Path:
    """The data set in Countdown-Tasks-3to4's form (`target` int64, `nums` list<int64>, one parquet
    under data/) in the cache; returns its snapshot."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = rehearsal_problems()
    table = pa.table({"target": pa.array([p.target for p in rows], pa.int64()),
                      "nums": pa.array([list(p.numbers) for p in rows], pa.list_(pa.int64()))})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "data").mkdir()
        pq.write_table(table, Path(tmp) / "data" / "train-00000-of-00001.parquet")
        (Path(tmp) / "README.md").write_text(
            f"# {REHEARSAL_DATASET}\n\nMade by dlcrepro.study.rehearsal: {len(rows)} solvable Countdown problems, "
            + ", ".join(f"{n} of {k} numbers in {a}-{b} with targets {c}-{d}" for k, n in DATASET_ROWS.items()
                        for (a, b), (c, d) in [DATASET_RANGES[k]])
            + ", in Jiayi-Pan/Countdown-Tasks-3to4's columns.\n")
        return write_snapshot(Path(tmp), REHEARSAL_DATASET, "dataset", cache)


# ----------------------------------------------------------------------------- the tokenizer


def train_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer trained on `texts`, digits split one by one, with Qwen3's special
    and added tokens and this project's chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # NFC, as Qwen3's tokenizer.json has, and as transformers' Qwen2Tokenizer rebuilds it whatever the file says
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=REHEARSAL_ARCH["max_position_embeddings"],
    )


def english_corpus() -> list[str]:
    """English prose for the tokenizer's merges beyond the task's few hundred: the help topics that
    ship with Python (`pydoc_data.topics`, ~0.5 MB), so a vocabulary of thousands is learned offline."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


def _chat_text(p: Problem, answer: str = "") -> str:
    """A whole exchange as text, for the tokenizer's training corpus."""
    return (f"{IM_START}user\n{countdown.instruction_prompt(p)}{IM_END}\n{IM_START}assistant\n"
            f"{THINK}\n\n{END_THINK}\n\n{answer}{IM_END}\n")


# ----------------------------------------------------------------------------- the checkpoint


def build_model(tokenizer, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    import torch

    im_end, eot = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    # no pad_token_id, as Qwen3's config.json has none: the trainer pads with the tokenizer's, and <|endoftext|>'s
    # embedding row is drawn like any other (a pad_token_id makes it the padding row: zero at the start, no input-side gradient)
    cfg = Qwen3Config(**REHEARSAL_ARCH, bos_token_id=eot, eos_token_id=im_end, dtype="bfloat16")
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(cfg)


def hub_config(model) -> dict:
    """The model's config.json in Qwen/Qwen3-0.6B's form, exactly QWEN3_CONFIG_KEYS: `rope_theta` with
    `rope_scaling: null`, `torch_dtype` (the weights are written in bfloat16), `sliding_window: null`."""
    import transformers

    cfg = model.config
    rope = cfg.rope_parameters
    if rope.get("rope_type", "default") != "default" or cfg.use_sliding_window:
        raise ValueError(f"hub_config: Qwen3's form has plain RoPE and no sliding window, not {rope} / {cfg.use_sliding_window}")
    legacy = {
        "architectures": [type(model).__name__],
        "rope_scaling": None,
        "rope_theta": rope["rope_theta"],
        "sliding_window": None,
        "torch_dtype": "bfloat16",
        "transformers_version": transformers.__version__,  # what wrote it, in the form 4.51 wrote
    }
    return {k: legacy[k] if k in legacy else getattr(cfg, k) for k in QWEN3_CONFIG_KEYS}


def save_tokenizer(tokenizer, out: Path) -> None:
    """The tokenizer's files as Qwen3's: tokenizer.json (NFC, the split, byte-level BPE), vocab.json and
    merges.txt, and tokenizer_config.json naming Qwen2Tokenizer, holding the chat template and the added
    tokens (`added_tokens_decoder`), with Qwen3's keys."""
    backend = tokenizer.backend_tokenizer
    out.mkdir(parents=True, exist_ok=True)
    backend.save(str(out / "tokenizer.json"))
    backend.model.save(str(out))  # vocab.json, merges.txt: what Qwen2Tokenizer reads without tokenizer.json
    fields = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    added = {str(i): {f: getattr(t, f) for f in fields} for i, t in sorted(backend.get_added_tokens_decoder().items())}
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t["content"] for t in added.values() if t["special"] and t["content"] != ENDOFTEXT],
        "bos_token": None,
        "chat_template": tokenizer.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": REHEARSAL_ARCH["max_position_embeddings"],
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def save_checkpoint_dir(model, tokenizer, out: Path, card: str) -> None:
    """The model's files beside the tokenizer's (`save_tokenizer`), as Qwen/Qwen3-0.6B ships its own:
    config.json (`hub_config`), model.safetensors (bfloat16), generation_config.json (its two stop
    tokens and sampling defaults) and a model card."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    model.to(torch.float32)
    (out / "config.json").write_text(json.dumps(hub_config(model), indent=2))
    stop = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    gen = {"bos_token_id": stop[1], "eos_token_id": stop, "pad_token_id": stop[1], **QWEN3_SAMPLING_DEFAULTS,
           "transformers_version": transformers.__version__}
    (out / "generation_config.json").write_text(json.dumps(dict(sorted(gen.items())), indent=2))
    (out / "README.md").write_text(card)


def build_checkpoint(cache: Path, dataset_snapshot: Path, n_train: int, ws: WarmstartConfig = REHEARSAL_WARMSTART) -> dict:
    """Train the tokenizer and warm-start the model on the data set's first `n_train` rows, measure
    greedy accuracy on the next rows with a vLLM engine, and lay the checkpoint into the cache."""
    from ..step import data
    from ..core.config import EngineConfig
    from ..step.engine import VLLMEngine
    from ..step.model import load_tokenizer
    from .warmstart import supervised_train

    train, test = countdown.load_parquet(dataset_snapshot, n_train, REHEARSAL_TEST_PROBLEMS)
    solved = [(p, countdown.worked_answer(p.numbers, p.target)) for p in train]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        save_tokenizer(train_tokenizer(english_corpus() + [_chat_text(p, a) for p, a in solved[:4000]]), out)
        tokenizer = load_tokenizer(out)  # as a paper job loads it (Qwen2Tokenizer): the warm start sees its ids
        model = build_model(tokenizer, ws.seed)
        prompts = data.encode_prompts(tokenizer, [p for p, _ in solved], "chat")
        answers = [tokenizer(a, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for _, a in solved]
        steps, loss, seconds = supervised_train(model, prompts, answers, ws, tokenizer.pad_token_id,
                                                f"rehearsal {REHEARSAL_MODEL}")
        model.eval()
        n_params = sum(p.numel() for p in model.parameters())
        card = (f"# {REHEARSAL_MODEL}\n\nMade by dlcrepro.study.rehearsal for the CPU rehearsal of the paper path: "
                f"Qwen3ForCausalLM {json.dumps(REHEARSAL_ARCH)}, {n_params} parameters; byte-level BPE tokenizer of "
                f"{len(tokenizer)} tokens; warm start {json.dumps(asdict(ws))} on worked answers of "
                f"{REHEARSAL_DATASET}'s first {n_train} rows.\n")
        save_checkpoint_dir(model, tokenizer, out, card)
        ecfg = EngineConfig(max_tokens=96)
        engine = VLLMEngine(tmp, ecfg, "bf16", seed=ws.seed)
        prompts_test = data.encode_prompts(tokenizer, test, "chat")
        responses = engine.greedy(prompts_test)
        acc = float(np.mean([r == countdown.REWARD_CORRECT for r in data.rewards(tokenizer, test, responses)]))
        snap = write_snapshot(out, REHEARSAL_MODEL, "model", cache)
    return {
        "model": REHEARSAL_MODEL,
        "snapshot": str(snap),
        "parameters": n_params,
        "tokenizer_size": len(tokenizer),
        "warmstart": asdict(ws),
        "steps": steps,
        "final_loss": round(loss, 4),
        "train_seconds": round(seconds, 1),
        "greedy_test_accuracy": acc,
        "mean_response_tokens": float(np.mean([len(r) for r in responses])),
        "n_test": len(test),
        "example": data.decode(tokenizer, responses[0]),
    }


def build(cache: Path | None = None, n_train: int = 12_000, warmstart_steps: int | None = None) -> dict:
    """The rehearsal's data set and checkpoint in `cache` (the Hugging Face cache by default);
    `warmstart_steps` shortens the warm start (tests)."""
    cache = Path(cache) if cache else hf_hub_cache()
    t0 = time.time()
    ds = write_dataset(cache)
    ws = REHEARSAL_WARMSTART if warmstart_steps is None else WarmstartConfig(**{**asdict(REHEARSAL_WARMSTART),
                                                                                "steps": warmstart_steps})
    summary = {"dataset": REHEARSAL_DATASET, "dataset_snapshot": str(ds), **build_checkpoint(cache, ds, n_train, ws)}
    summary["seconds_total"] = round(time.time() - t0, 1)
    log(f"rehearsal: "
        f"{json.dumps({k: summary[k] for k in ('parameters', 'steps', 'greedy_test_accuracy', 'mean_response_tokens')})}")
    return summary
