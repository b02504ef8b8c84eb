"""Problems and prompts for a config: the splits, prompt token ids, response scoring."""

from __future__ import annotations

from typing import Sequence

from . import countdown
from ..core.config import TaskConfig
from .countdown import Problem
from ..core.paths import resolve_dataset_path


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
