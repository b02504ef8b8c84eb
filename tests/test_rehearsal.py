"""The rehearsal of the paper path: configs/rehearsal.yaml is configs/paper.yaml but for ids, sizes and
hardware; its checkpoint and data set are made here into a Hugging Face cache, found by id as a
download is, and a paper job (`kind: hf`, BPE tokenizer, chat template, parquet, top-k below the
vocabulary) trains on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

PAPER, REHEARSAL = ROOT / "configs" / "paper.yaml", ROOT / "configs" / "rehearsal.yaml"
# The rehearsal stands in one model for the paper's first; the second is left out (its time).
MODEL_MAP = {"qwen3-0.6b": "qwen3-rehearsal"}
# What the rehearsal may change: which model and data (ids), how much (sizes), on what (hardware),
# and where its outputs go. Anything else must be the paper's.
ALLOWED = {
    "ids": {"name", "models.*.path", "task.path"},
    "sizes": {"task.n_train", "task.n_test", "engine.max_tokens", "train.steps", "train.prompts_per_step",
              "train.responses_per_prompt", "train.eval_every", "train.ckpt_every", "grid.seeds",
              "models.*.train.micro_batch", "models.*.train.micro_batch_tokens", "models.qwen3-1.7b"},
    "hardware": {"train_env", "models.*.resources", "models.*.trainer_dtype"},
    "outputs": {"results_dir", "figures_dir", "tables_dir"},
}


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not key.endswith("resources") and key != "models.qwen3-1.7b":
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def paper_vs_rehearsal() -> list[tuple[str, object, object]]:
    paper = yaml.safe_load(PAPER.read_text())
    paper["models"] = {MODEL_MAP.get(k, k): v for k, v in paper["models"].items()}
    paper["grid"]["models"] = [MODEL_MAP[m] for m in paper["grid"]["models"] if m in MODEL_MAP]
    a, b = flatten(paper), flatten(yaml.safe_load(REHEARSAL.read_text()))
    return [(k, a.get(k, "<absent>"), b.get(k, "<absent>")) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def allowed(key: str) -> bool:
    generic = ".".join("*" if i == 1 and key.startswith("models.") else part for i, part in enumerate(key.split(".")))
    return any(key in keys or generic in keys for keys in ALLOWED.values())


def test_rehearsal_config_is_the_paper_config_but_ids_sizes_and_hardware():
    diff = paper_vs_rehearsal()
    print("\nconfigs/paper.yaml -> configs/rehearsal.yaml (qwen3-0.6b read as qwen3-rehearsal):")
    for key, paper, rehearsal in diff:
        print(f"  {key}: {paper!r} -> {rehearsal!r}" + ("" if allowed(key) else "   <-- NOT an id, size or hardware"))
    assert diff, "the rehearsal must differ in its ids at least"
    assert [k for k, _, _ in diff if not allowed(k)] == []


def test_rehearsal_diff_catches_a_changed_learning_rate(tmp_path, monkeypatch):
    cfg = yaml.safe_load(REHEARSAL.read_text())
    cfg["train"]["lr"] = 0.5
    changed = tmp_path / "rehearsal.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    monkeypatch.setattr(sys.modules[__name__], "REHEARSAL", changed)
    assert [k for k, _, _ in paper_vs_rehearsal() if not allowed(k)] == ["train.lr"]


# ----------------------------------------------------------------------------- the assets, built


@pytest.mark.engine
def test_rehearsal_assets_sit_in_the_cache_as_a_download_and_are_found_by_id(rehearsal_cache, monkeypatch):
    from dlcrepro.step import countdown, data
    from dlcrepro.core import paths
    from dlcrepro.core.config import load
    from dlcrepro.step.model import load_tokenizer

    repo = rehearsal_cache / "models--dlcrepro--Qwen3-Rehearsal"
    commit = (repo / "refs" / "main").read_text().strip()
    snap = repo / "snapshots" / commit
    assert (snap / "model.safetensors").is_symlink()
    assert (snap / "model.safetensors").resolve().parent == (repo / "blobs").resolve()
    monkeypatch.setenv("HF_HUB_CACHE", str(rehearsal_cache))
    cfg = load(REHEARSAL)
    assert paths.model_dir(cfg, "qwen3-rehearsal") == snap  # by id, through refs/main

    arch = json.loads((snap / "config.json").read_text())
    assert arch["architectures"] == ["Qwen3ForCausalLM"] and arch["tie_word_embeddings"]
    assert arch["num_key_value_heads"] < arch["num_attention_heads"] and arch["head_dim"] == 128
    assert arch["hidden_size"] % 128 == 0 and arch["intermediate_size"] % 128 == 0
    assert arch["vocab_size"] >= 100 * cfg.engine.topk

    tok = load_tokenizer(snap)
    assert len(tok) > 2000
    train, test = data.load_problems(cfg.task)
    assert (len(train), len(test)) == (cfg.task.n_train, cfg.task.n_test)
    assert not {p.key for p in train} & {p.key for p in test}
    text = data.prompt_text(tok, test[0], "chat")
    assert text.startswith("<|im_start|>user\nUsing the numbers [")
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    digits = tok.convert_ids_to_tokens(tok("4096", add_special_tokens=False).input_ids)
    assert [d.lstrip("Ġ") for d in digits] == ["4", "0", "9", "6"]  # digit by digit, as Qwen's
    worked = countdown.worked_answer(test[0].numbers, test[0].target)
    ids = tok(worked, add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert countdown.score(data.decode(tok, ids), test[0].numbers, test[0].target) == countdown.REWARD_CORRECT
    assert len(ids) >= 15


@pytest.mark.slow
def test_a_paper_job_trains_on_the_rehearsal_checkpoint_with_topk_below_the_vocabulary(rehearsal_cache, tmp_path):
    """One cell through `python -m dlcrepro train`, as the workflow calls it: the model given by its
    id, the fp8 sampler, `center` (reads the engine's top-20 of 3,072), several micro-batches a step,
    and the paper's bf16 trainer (the grid runs it in float32 on CPUs: configs/rehearsal.yaml)."""
    out = tmp_path / "cell"
    env = {**os.environ, "HF_HUB_CACHE": str(rehearsal_cache), "OMP_NUM_THREADS": "2"}
    p = subprocess.run([sys.executable, "-m", "dlcrepro", "train", "--config", str(REHEARSAL), "--model", "qwen3-rehearsal",
                        "--model-dir", "dlcrepro/Qwen3-Rehearsal", "--sampler", "fp8", "--correction", "center", "--seed", "0",
                        "--out", str(out), "--set", "models.qwen3-rehearsal.trainer_dtype=bfloat16", "--set", "train.steps=2",
                        "--set", "train.eval_every=2", "--set", "task.n_test=8"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1800, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    fp8_path = [line for line in p.stderr.splitlines() if "fp8 engine:" in line]
    print("\n" + "\n".join(fp8_path))  # which FP8 path ran: native where the CPU has AMX and fp8_backend asks for it
    assert fp8_path
    import pandas as pd

    df = pd.read_parquet(out / "metrics.parquet")
    assert list(df["step"]) == [1, 2]
    assert (df["response_len_mean"] > 5).all()
    assert df["kl_sampler"].notna().all() and df["dev"].notna().all()


# ----------------------------------------------------------------------------- the files, as the Hub ships Qwen3

# The keys of Qwen/Qwen3-0.6B's config.json on the Hub (written by transformers 4.51), all of them.
QWEN3_0_6B_CONFIG_KEYS = [
    "architectures", "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "head_dim", "hidden_act",
    "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings", "max_window_layers", "model_type",
    "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
    "sliding_window", "tie_word_embeddings", "torch_dtype", "transformers_version", "use_cache", "use_sliding_window",
    "vocab_size",
]
# Qwen3-0.6B's published chat template, verbatim; its source: tests/data/README.md
QWEN3_TEMPLATE = ROOT / "tests" / "data" / "qwen3_0.6b_chat_template.jinja"
QWEN3_TEMPLATE_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"


def snapshot(cache: Path) -> Path:
    """The rehearsal checkpoint's snapshot in `cache`, through refs/main."""
    repo = cache / "models--dlcrepro--Qwen3-Rehearsal"
    return repo / "snapshots" / (repo / "refs" / "main").read_text().strip()


def copy_with(snap: Path, dest: Path, **files: dict) -> Path:
    """A plain copy of the snapshot (symlinks followed), with the JSON files named in `files` replaced
    (`config_json=` for config.json and so on)."""
    import shutil

    shutil.copytree(snap, dest, symlinks=False)
    for name, content in files.items():
        (dest / name.replace("_json", ".json")).write_text(json.dumps(content, indent=2))
    return dest


@pytest.mark.engine
def test_rehearsal_checkpoint_files_are_in_the_form_the_hub_ships_qwen3(rehearsal_cache):
    from dlcrepro.study.rehearsal import CHAT_TEMPLATE, END_THINK, ENDOFTEXT, IM_END, IM_START, THINK

    snap = snapshot(rehearsal_cache)
    assert sorted(p.name for p in snap.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "merges.txt", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "vocab.json"]
    arch = json.loads((snap / "config.json").read_text())
    assert list(arch) == QWEN3_0_6B_CONFIG_KEYS  # no rope_parameters, dtype, pad_token_id or layer_types
    legacy = (arch["rope_scaling"], arch["rope_theta"], arch["sliding_window"], arch["torch_dtype"])
    assert legacy == (None, 1e6, None, "bfloat16")

    tc = json.loads((snap / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "Qwen2Tokenizer" and tc["chat_template"] == CHAT_TEMPLATE
    added = {t["content"]: t["special"] for t in tc["added_tokens_decoder"].values()}
    assert added == {ENDOFTEXT: True, IM_START: True, IM_END: True, THINK: False, END_THINK: False}  # Qwen3's flags
    assert (tc["eos_token"], tc["pad_token"], tc["bos_token"], tc["unk_token"]) == (IM_END, ENDOFTEXT, None, None)
    assert json.loads((snap / "tokenizer.json").read_text())["normalizer"] == {"type": "NFC"}

    gen = json.loads((snap / "generation_config.json").read_text())
    ids = {t["content"]: int(i) for i, t in tc["added_tokens_decoder"].items()}
    assert gen["eos_token_id"] == [ids[IM_END], ids[ENDOFTEXT]] and gen["bos_token_id"] == gen["pad_token_id"] == ids[ENDOFTEXT]
    assert (gen["temperature"], gen["top_k"], gen["top_p"], gen["do_sample"]) == (0.6, 20, 0.95, True)


@pytest.mark.engine
def test_the_tokenizer_encodes_alike_as_qwen2tokenizer_from_its_json_or_its_vocab_and_merges_and_raw(rehearsal_cache, tmp_path):
    """transformers' Qwen2Tokenizer rebuilds NFC, the split and byte-level itself and takes only the vocabulary
    and merges from the files; the `tokenizers` library reads tokenizer.json as written. All three agree, on
    the prompts and answers and on text that NFC changes (an `e` and a combining accent is `é`)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from dlcrepro.step import countdown, data
    from dlcrepro.step.model import load_tokenizer
    from dlcrepro.study.rehearsal import rehearsal_problems

    snap = snapshot(rehearsal_cache)
    tok = load_tokenizer(snap)
    vocab_merges = copy_with(snap, tmp_path / "no-tokenizer-json")
    (vocab_merges / "tokenizer.json").unlink()
    from_vocab = AutoTokenizer.from_pretrained(vocab_merges)
    raw = Tokenizer.from_file(str(snap / "tokenizer.json"))
    assert type(tok).__name__ == type(from_vocab).__name__ == "Qwen2Tokenizer"

    problems = rehearsal_problems()[:64]
    texts = [data.prompt_text(tok, p, "chat") for p in problems]
    texts += [countdown.worked_answer(p.numbers, p.target) for p in problems]
    texts += ["caf\u00e9", "cafe\u0301", "\u00dcn\u00efc\u00f6d\u00e9 \ufb01 1\u20442", "<think>\n\n</think>\n\n<answer>"]
    for text in texts:
        ids = tok(text, add_special_tokens=False).input_ids
        assert from_vocab(text, add_special_tokens=False).input_ids == ids == raw.encode(text, add_special_tokens=False).ids, text
    assert raw.encode("cafe\u0301").ids == raw.encode("caf\u00e9").ids  # NFC in the file, as in Qwen2Tokenizer


@pytest.mark.engine
def test_qwen3s_published_chat_template_renders_the_projects_prompts_byte_for_byte(rehearsal_cache, monkeypatch):
    """The rehearsal's template is written here (rehearsal.CHAT_TEMPLATE); Qwen3-0.6B's own, verbatim, renders
    every prompt a rehearsal job sends (user turn, generation prompt, thinking disabled) to the same bytes."""
    import hashlib

    from dlcrepro.step import countdown, data
    from dlcrepro.core.config import load
    from dlcrepro.step.model import load_tokenizer

    qwen3 = QWEN3_TEMPLATE.read_bytes()
    assert hashlib.sha256(qwen3).hexdigest() == QWEN3_TEMPLATE_SHA256  # still the published bytes
    monkeypatch.setenv("HF_HUB_CACHE", str(rehearsal_cache))
    cfg = load(REHEARSAL)
    train, test = data.load_problems(cfg.task)
    tok = load_tokenizer(snapshot(rehearsal_cache))
    problems = train[:512] + test
    template = qwen3.decode()
    published = [tok.apply_chat_template([{"role": "user", "content": countdown.instruction_prompt(p)}], chat_template=template,
                                         tokenize=False, add_generation_prompt=True, enable_thinking=False)
                 for p in problems]
    ours = [data.prompt_text(tok, p, cfg.task.prompt) for p in problems]
    assert [t.encode() for t in ours] == [t.encode() for t in published]
    assert published[0].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert data.encode_prompts(tok, problems, cfg.task.prompt) == [tok(t, add_special_tokens=False).input_ids for t in published]


def teacher_forcing_batch(snap: Path, n: int = 8) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, worked answers) of the first `n` data set rows, as token ids: likely tokens after the warm start."""
    from dlcrepro.step import countdown, data
    from dlcrepro.step.model import load_tokenizer
    from dlcrepro.study.rehearsal import rehearsal_problems

    tok = load_tokenizer(snap)
    problems = rehearsal_problems()[:n]
    answers = [tok(countdown.worked_answer(p.numbers, p.target), add_special_tokens=False).input_ids + [tok.eos_token_id]
               for p in problems]
    return data.encode_prompts(tok, problems, "chat"), answers


@pytest.mark.engine
def test_rope_theta_and_torch_dtype_in_the_hub_form_reach_the_trainer_and_the_engine(rehearsal_cache, tmp_path):
    """transformers 5 moves `rope_theta` (with `rope_scaling: null`) into `rope_parameters` and `torch_dtype` into
    `dtype`; vLLM reads the config through transformers. Qwen3's θ = 10^6 is also vLLM's default for Qwen3
    (models/qwen3.py, `set_default_rope_theta`), so a copy with θ = 10^4 shows the key is read, not defaulted:
    at each θ the engine and the trainer agree, and the two θ give different log-probs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dlcrepro.core.config import EngineConfig
    from dlcrepro.step.engine import VLLMEngine
    from dlcrepro.step.model import load_model, make_token_batch, response_logits, token_logprobs

    snap = snapshot(rehearsal_cache)
    arch = json.loads((snap / "config.json").read_text())
    dirs = {1e6: snap, 1e4: copy_with(snap, tmp_path / "theta-1e4", config_json={**arch, "rope_theta": 10000.0})}
    prompts, answers = teacher_forcing_batch(snap)
    tb = make_token_batch(prompts, answers)
    pi, q = {}, {}
    for theta, d in dirs.items():
        assert AutoConfig.from_pretrained(d).rope_parameters == {"rope_type": "default", "rope_theta": theta}
        assert AutoModelForCausalLM.from_pretrained(d, dtype="auto").dtype == torch.bfloat16  # torch_dtype read
        with torch.no_grad():
            pi[theta] = token_logprobs(response_logits(load_model(d).eval(), tb), tb.tokens)
        engine = VLLMEngine(str(d), EngineConfig(max_tokens=8), "bf16", seed=0)
        hf = engine.llm.llm_engine.model_config.hf_config
        assert hf.rope_parameters["rope_theta"] == theta and hf.dtype == torch.bfloat16
        q[theta] = torch.cat(engine.teacher_forced_logp(prompts, answers))
    agree = {theta: float((q[theta] - pi[theta]).abs().mean()) for theta in dirs}
    apart = float((pi[1e6] - pi[1e4]).abs().mean())
    print(f"\nmean |log q - log pi| per token: {agree}; trainer at 1e6 vs 1e4: {apart:.4f} ({len(tb.tokens)} tokens)")
    assert max(agree.values()) < 0.05 and apart > 5 * max(agree.values())


@pytest.mark.engine
def test_qwen3s_sampling_defaults_in_generation_config_change_nothing_the_engine_samples(rehearsal_cache, tmp_path):
    """vLLM reads generation_config.json's temperature 0.6, top-k 20 and top-p 0.95, but applies them only to a
    call without SamplingParams; the engine passes its own on every call. Two engines, on the checkpoint and on
    a copy whose generation_config.json keeps only the stop tokens, sample the same tokens with the same log-probs."""
    import torch

    from dlcrepro.core.config import EngineConfig
    from dlcrepro.step.engine import VLLMEngine
    from dlcrepro.study.rehearsal import QWEN3_SAMPLING_DEFAULTS

    snap = snapshot(rehearsal_cache)
    gen = json.loads((snap / "generation_config.json").read_text())
    plain = {k: v for k, v in gen.items() if k not in QWEN3_SAMPLING_DEFAULTS}
    dirs = {"with": snap, "without": copy_with(snap, tmp_path / "stop-tokens-only", generation_config_json=plain)}
    prompts, answers = teacher_forcing_batch(snap)
    out = {}
    for name, d in dirs.items():
        engine = VLLMEngine(str(d), EngineConfig(max_tokens=48), "bf16", seed=0)
        read = engine.llm.llm_engine.model_config.try_get_generation_config()
        expected = (0.6, 20, 0.95) if name == "with" else (None, None, None)
        assert tuple(read.get(k) for k in ("temperature", "top_k", "top_p")) == expected
        assert engine.llm.get_default_sampling_params().temperature == 1.0  # generation_config="vllm"
        r = engine.generate(prompts, n=4, seed=1, topk=20)
        out[name] = (r, engine.greedy(prompts), torch.cat(engine.teacher_forced_logp(prompts, answers)))
    (a, greedy_a, forced_a), (b, greedy_b, forced_b) = out["with"], out["without"]
    assert a.response_ids == b.response_ids and sum(map(len, a.response_ids)) > 8 * 4 * 5
    for x, y in ((a.engine_logp, b.engine_logp), (a.topk_ids, b.topk_ids), (a.topk_logp, b.topk_logp), (forced_a, forced_b)):
        assert torch.equal(x, y)
    assert greedy_a == greedy_b
    # temperature 1 and no truncation: the 20 most likely tokens' probabilities do not sum to 1, as top-k 20 would make them
    assert (a.topk_logp.exp().sum(-1) < 0.999).any()
