"""Countdown: use each given number once with + - * / and parentheses to reach the target.

Everything here is pure Python on exact rationals. Model output is hostile text: it is parsed
by a bounded recursive-descent parser, never evaluated.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

REWARD_CORRECT = 1
REWARD_WRONG = -1
MAX_ANSWER_CHARS = 256  # longer "answers" are wrong without being parsed
MAX_DEPTH = 32  # parenthesis nesting beyond this is wrong, not a RecursionError

_OPS = "+-*/"


@dataclass(frozen=True)
class Problem:
    """One Countdown problem: `numbers` (each used exactly once) and `target`."""

    numbers: tuple[int, ...]
    target: int

    @property
    def key(self) -> tuple[tuple[int, ...], int]:
        """Identity used for train/test disjointness: the multiset of numbers and the target."""
        return tuple(sorted(self.numbers)), self.target


# ----------------------------------------------------------------------------- solver


def _combine(a: Fraction, b: Fraction, nice: bool) -> Iterator[tuple[Fraction, str]]:
    """a op b; `nice` keeps every intermediate a non-negative integer (the solutions people write)."""
    yield a + b, "+"
    if not nice or a >= b:
        yield a - b, "-"
    yield a * b, "*"
    if b != 0 and (not nice or a % b == 0):
        yield a / b, "/"


def _reach(items: tuple[tuple[Fraction, str], ...], nice: bool = False) -> Iterator[tuple[Fraction, str]]:
    """All (value, expression) pairs that use every item exactly once."""
    if len(items) == 1:
        yield items[0]
        return
    for i, j in itertools.permutations(range(len(items)), 2):
        rest = tuple(x for k, x in enumerate(items) if k not in (i, j))
        (va, ea), (vb, eb) = items[i], items[j]
        for v, op in _combine(va, vb, nice):
            yield from _reach(((v, f"({ea}{op}{eb})"),) + rest, nice)


def _leaves(numbers: Sequence[int]) -> tuple[tuple[Fraction, str], ...]:
    return tuple((Fraction(n), str(n)) for n in numbers)


def solve(numbers: Sequence[int], target: int) -> str | None:
    """An expression using every number once that equals `target`, or None.

    Solutions whose intermediate values are all non-negative integers come first: they are the
    ones the warm start teaches, one consistent kind of answer per problem.
    """
    for nice in (True, False):
        for value, expr in _reach(_leaves(numbers), nice):
            if value == target:
                return expr[1:-1] if len(numbers) > 1 else expr
    return None


def _values(items: tuple[int | Fraction, ...]) -> set[int | Fraction]:
    """Every value reachable using each item exactly once (no expressions built: fast). Values are
    exact: ints where integral, Fractions only where a division leaves a remainder (integer
    arithmetic keeps the problem generator at ~0.3 s; with Fractions throughout it took 0.6 s)."""
    if len(items) == 1:
        return {items[0]}
    out: set[int | Fraction] = set()
    for i, j in itertools.combinations(range(len(items)), 2):
        rest = tuple(x for k, x in enumerate(items) if k not in (i, j))
        a, b = items[i], items[j]
        combos = {a + b, a - b, b - a, a * b}
        if b != 0:
            combos.add(_exact_div(a, b))
        if a != 0:
            combos.add(_exact_div(b, a))
        if not rest:
            out |= combos
            continue
        for v in combos:
            out |= _values((v,) + rest)
    return out


def _exact_div(a: int | Fraction, b: int | Fraction) -> int | Fraction:
    q = Fraction(a) / b
    return q.numerator if q.denominator == 1 else q


def reachable_targets(numbers: Sequence[int]) -> set[int]:
    """Every integer value reachable with all the numbers."""
    return {int(v) for v in _values(tuple(int(n) for n in numbers)) if v.denominator == 1}


def working_steps(expression: str) -> list[str]:
    """The solver's fully parenthesised `expression` as one line per operation, innermost first,
    each with its value: `(3*5)+4` -> ["3*5=15", "15+4=19"]. What a model that works in steps
    writes before its answer; every intermediate value is exact (Fractions print as `a/b`)."""
    toks, steps = _tokenize(expression), []

    def operand(i: int) -> tuple[Fraction, int]:
        if toks[i] == "(":
            value, i = binary(i + 1)
            if toks[i] != ")":
                raise ValueError(f"working_steps: unbalanced {expression!r}")
            return value, i + 1
        return Fraction(int(toks[i])), i + 1

    def binary(i: int) -> tuple[Fraction, int]:
        a, i = operand(i)
        while i < len(toks) and toks[i] in _OPS:
            op = toks[i]
            b, i = operand(i + 1)
            value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
            steps.append(f"{a}{op}{b}={value}")
            a = value
        return a, i

    _, end = binary(0)
    if end != len(toks):
        raise ValueError(f"working_steps: trailing tokens in {expression!r}")
    return steps


def worked_answer(numbers: Sequence[int], target: int) -> str | None:
    """A response in steps: the working line, then the answer in the paper's tags, e.g.
    `3*5=15, 15+4=19\n<answer>(3*5)+4</answer>`; None for an unsolvable problem."""
    expr = solve(numbers, target)
    if expr is None:
        return None
    return ", ".join(working_steps(expr)) + f"\n<answer>{expr}</answer>"


# ----------------------------------------------------------------------------- generator


def generate(
    n: int,
    *,
    seed: int,
    num_numbers: int = 3,
    number_range: tuple[int, int] = (1, 20),
    target_range: tuple[int, int] = (1, 100),
) -> list[Problem]:
    """`n` distinct solvable problems, deterministic in `seed`.

    A problem is a multiset of `num_numbers` numbers from `number_range` (inclusive) and a target
    in `target_range` reachable with all of them; problems are drawn uniformly among all such
    distinct problems, and each problem's numbers are shown in a random order.
    """
    lo, hi = number_range
    tlo, thi = target_range
    rng = np.random.default_rng(seed)
    multisets = list(itertools.combinations_with_replacement(range(lo, hi + 1), num_numbers))
    if len(multisets) > 200_000:
        raise ValueError(f"countdown: numbers {number_range} x{num_numbers} give {len(multisets)} multisets; too many to "
                         "enumerate")
    space = [(m, t) for m in multisets for t in sorted(reachable_targets(m)) if tlo <= t <= thi]
    if n > len(space):
        raise ValueError(
            f"countdown: cannot draw {n} distinct solvable problems from numbers {number_range} "
            f"x{num_numbers} and targets {target_range}: only {len(space)} exist"
        )
    out = []
    for i in rng.permutation(len(space))[:n]:
        nums, target = space[i]
        out.append(Problem(tuple(int(x) for x in rng.permutation(nums)), int(target)))
    return out


def split(problems: Sequence[Problem], n_test: int) -> tuple[list[Problem], list[Problem]]:
    """Disjoint train/test split: the last `n_test` problems are the test set."""
    if n_test >= len(problems):
        raise ValueError(f"countdown: n_test={n_test} leaves no training problems")
    train, test = list(problems[:-n_test]), list(problems[-n_test:])
    assert not {p.key for p in train} & {p.key for p in test}
    return train, test


def load_parquet(path: str | Path, n_train: int = 327_680, n_test: int = 1024) -> tuple[list[Problem], list[Problem]]:
    """Countdown-Tasks-3to4 (columns `nums`, `target`): train = first `n_train` rows, test = next `n_test`."""
    import pyarrow.parquet as pq

    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"countdown: no .parquet file under {path}")
    rows: list[Problem] = []
    for f in files:
        table = pq.read_table(f, columns=["nums", "target"])
        for nums, target in zip(table.column("nums").to_pylist(), table.column("target").to_pylist()):
            rows.append(Problem(tuple(int(x) for x in nums), int(target)))
        if len(rows) >= n_train + n_test:
            break
    if len(rows) < n_train + n_test:
        raise ValueError(f"countdown: {path} has {len(rows)} rows, need n_train+n_test={n_train + n_test}")
    return rows[:n_train], rows[n_train : n_train + n_test]


# ----------------------------------------------------------------------------- prompts


def compact_prompt(p: Problem) -> str:
    """The tiny model's prompt: `a,b,c=>T:`; the answer follows directly, e.g. `(a*b)-c`."""
    return ",".join(map(str, p.numbers)) + f"=>{p.target}:"


def instruction_prompt(p: Problem) -> str:
    """TinyZero-style instruction for Qwen3 (goes through the chat template)."""
    nums = ", ".join(map(str, p.numbers))
    return (
        f"Using the numbers [{nums}], create an equation that equals {p.target}. "
        "You can use basic arithmetic operations (+, -, *, /) and each number must be used exactly once. "
        "Show your work in <think> </think> tags. "
        "Return the final equation in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )


# ----------------------------------------------------------------------------- scoring

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# [0-9], not \d: \d, int() and str.isdigit() also take '３', '٣' (and isdigit '²'); the reward counts
# the numbers as given, written in ASCII digits.
_TOKEN_RE = re.compile(r"\s*([0-9]+|[-+*/()×÷−])")
_DIGITS = frozenset("0123456789")
_CANON = {"×": "*", "÷": "/", "−": "-"}


class _Bad(Exception):
    """The answer is not a valid expression."""


def extract_answer(response: str) -> str:
    """The final answer: the last `<answer>…</answer>` if there is one, else the whole text."""
    found = _ANSWER_RE.findall(response)
    text = found[-1] if found else response
    return text.strip()


def _tokenize(text: str) -> list[str]:
    toks, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise _Bad(f"unexpected character at {pos}")
        tok = m.group(1)
        toks.append(_CANON.get(tok, tok))
        pos = m.end()
    return toks


class _Parser:
    """expr := term (('+'|'-') term)* ; term := atom (('*'|'/') atom)* ; atom := INT | '(' expr ')'"""

    def __init__(self, toks: list[str]):
        self.toks, self.i, self.used = toks, 0, []

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Bad("unexpected end")
        self.i += 1
        return tok

    def expr(self, depth: int) -> Fraction:
        v = self.term(depth)
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term(depth)
            v = v + rhs if op == "+" else v - rhs
        return v

    def term(self, depth: int) -> Fraction:
        v = self.atom(depth)
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.atom(depth)
            if op == "*":
                v = v * rhs
            elif rhs == 0:
                raise _Bad("division by zero")
            else:
                v = v / rhs
        return v

    def atom(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise _Bad("too deep")
        tok = self.take()
        if tok == "(":
            v = self.expr(depth + 1)
            if self.take() != ")":
                raise _Bad("unbalanced parenthesis")
            return v
        if _DIGITS.issuperset(tok):
            if len(tok) > 1 and tok[0] == "0":
                raise _Bad("leading zero")
            self.used.append(int(tok))
            return Fraction(int(tok))
        raise _Bad(f"unexpected {tok!r}")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the numbers it uses; raises ValueError if invalid."""
    if len(expression) > MAX_ANSWER_CHARS:
        raise ValueError("expression too long")
    try:
        parser = _Parser(_tokenize(expression))
        value = parser.expr(0)
        if parser.peek() is not None:
            raise _Bad("trailing tokens")
    except _Bad as e:
        raise ValueError(str(e)) from None
    return value, parser.used


def score(response: str, numbers: Sequence[int], target: int) -> int:
    """+1 if the final answer uses every number exactly once and equals `target` exactly, else -1."""
    if len(response) > 16 * MAX_ANSWER_CHARS:
        return REWARD_WRONG
    answer = extract_answer(response)
    # An equation "expr = target" is accepted when its right side is exactly the target.
    if answer.count("=") == 1:
        answer, rhs = answer.split("=")
        if rhs.strip() != str(target):
            return REWARD_WRONG
    try:
        value, used = evaluate(answer)
    except ValueError:
        return REWARD_WRONG
    ok = sorted(used) == sorted(int(n) for n in numbers) and value == target
    return REWARD_CORRECT if ok else REWARD_WRONG
