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
    from dlcrepro import countdown, data, paths
    from dlcrepro.config import load
    from dlcrepro.model import load_tokenizer

    repo = rehearsal_cache / "models--dlcrepro--Qwen3-Rehearsal"
    commit = (repo / "refs" / "main").read_text().strip()
    snap = repo / "snapshots" / commit
    assert (snap / "model.safetensors").is_symlink() and (snap / "model.safetensors").resolve().parent == (repo / "blobs").resolve()
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
    assert text.startswith("<|im_start|>user\nUsing the numbers [") and text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
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
                        "--out", str(out), "--set", "models.qwen3-rehearsal.trainer_dtype=bfloat16", "--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "task.n_test=8"],
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
