"""Problems and prompts for a config: the splits, prompt token ids, response scoring."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from . import countdown
from .config import ConfigError, TaskConfig
from .countdown import Problem


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface")).expanduser() / "hub"


def resolve_local(path: str, kind: str, key: str) -> Path:
    """A local path, or a Hugging Face `kind` ("model" or "dataset") id found in the local cache.

    Never downloads: jobs run with HF_HUB_OFFLINE=1, so a missing item is an error saying how to
    fetch it on a login node.
    """
    p = Path(path).expanduser()
    if p.exists():
        return p
    hub = hf_hub_cache()
    snaps = sorted((hub / f"{kind}s--{path.replace('/', '--')}" / "snapshots").glob("*"))
    if snaps:
        return snaps[-1]
    flag = " --repo-type dataset" if kind == "dataset" else ""
    raise ConfigError(
        f"{key}={path!r}: no such path and not in the Hugging Face cache ({hub}). "
        f"Fetch it on a login node first: `huggingface-cli download{flag} {path}`"
    )


def resolve_dataset_path(path: str) -> Path:
    return resolve_local(path, "dataset", "task.path")


def load_problems(task: TaskConfig) -> tuple[list[Problem], list[Problem]]:
    """(train, test) problems of the config, deterministic and disjoint."""
    if task.source == "parquet":
        return countdown.load_parquet(resolve_dataset_path(task.path), task.n_train, task.n_test)
    problems = countdown.generate(
        task.n_train + task.n_test,
        seed=task.seed,
        num_numbers=task.num_numbers,
        number_range=tuple(task.number_range),
        target_range=tuple(task.target_range),
    )
    return countdown.split(problems, task.n_test)


def prompt_text(tokenizer, p: Problem, kind: str) -> str:
    if kind == "compact":
        return countdown.compact_prompt(p)
    messages = [{"role": "user", "content": countdown.instruction_prompt(p)}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)


def encode_prompts(tokenizer, problems: Sequence[Problem], kind: str) -> list[list[int]]:
    """Prompt token ids; the chat template already holds its special tokens, so none are added."""
    return [tokenizer(prompt_text(tokenizer, p, kind), add_special_tokens=False).input_ids for p in problems]


def decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def rewards(tokenizer, problems: Sequence[Problem], responses: Sequence[Sequence[int]]) -> list[int]:
    """+1/-1 per response; `problems[i]` is the problem of `responses[i]`."""
    return [countdown.score(decode(tokenizer, r), p.numbers, p.target) for p, r in zip(problems, responses)]
