"""Why a worked-answer model's greedy held-out answers fail: a wrong intermediate value (a step
whose written result is not its operation's), a right working whose answer misses the target, or
a working line that does not parse.

    .venv/bin/python bench/worked_failures.py [CONFIG] [MODEL_DIR]

Defaults: the held-out pilot's config and warm start (configs/pilots/heldout_worked.yaml).
"""

from __future__ import annotations

import collections
import re
import sys
from fractions import Fraction

from dlcrepro.step import countdown, data
from dlcrepro.core.config import load
from dlcrepro.step.engine import VLLMEngine
from dlcrepro.step.model import load_tokenizer

STEP = re.compile(r"(-?[\d/]+)([-+*/])(-?[\d/]+)=(-?[\d/]+)")


def classify(text: str, numbers, target: int) -> str:
    """One response's verdict."""
    if countdown.score(text, numbers, target) == countdown.REWARD_CORRECT:
        return "correct"
    wrong_value = False
    for step in text.split("\n")[0].split(", "):
        m = STEP.fullmatch(step.strip())
        if not m:
            return "malformed working"
        a, op, b, v = m.groups()
        try:
            a, b, v = Fraction(a), Fraction(b), Fraction(v)
            want = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
        except (ZeroDivisionError, ValueError):
            return "malformed working"
        wrong_value |= want != v
    return "wrong intermediate value" if wrong_value else "working right, answer wrong"


def main() -> None:
    cfg = load(sys.argv[1] if len(sys.argv) > 1 else "configs/pilots/heldout_worked.yaml")
    model_dir = sys.argv[2] if len(sys.argv) > 2 else f"{cfg.artifacts}/tiny/model"
    tok = load_tokenizer(model_dir)
    _, test = data.load_problems(cfg.task)
    engine = VLLMEngine(model_dir, cfg.engine, "bf16", seed=0, max_model_len=64 + cfg.engine.max_tokens)
    outs = engine.greedy(data.encode_prompts(tok, test, cfg.task.prompt))
    counts, examples = collections.Counter(), {}
    for p, ids in zip(test, outs):
        text = tok.decode(ids, skip_special_tokens=True)
        verdict = classify(text, p.numbers, p.target)
        counts[verdict] += 1
        examples.setdefault(verdict, (p, text))
    print(f"{dict(counts)} of {len(test)}")
    for verdict, (p, text) in examples.items():
        print(f"{verdict}: {p.numbers} -> {p.target}: {text!r}")


if __name__ == "__main__":
    main()
