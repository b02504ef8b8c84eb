"""Every random draw of a run, seeded from (run seed, step, purpose): so a resumed run draws what an
uninterrupted one does, and every cell of a seed draws the same prompts."""

from __future__ import annotations

import zlib

import numpy as np


def derive_seed(seed: int, step: int, purpose: str) -> int:
    """A 32-bit seed that depends only on (run seed, step, purpose)."""
    ss = np.random.SeedSequence([seed, step, zlib.crc32(purpose.encode())])
    return int(ss.generate_state(1, dtype=np.uint32)[0])


def step_problems(seed: int, step: int, pool: int, n: int) -> list[int]:
    """The indices of step `step`'s `n` training problems, drawn without replacement from the first
    `pool` (the RL pool): the same in every cell of a seed, whatever its sampler or correction."""
    rng = np.random.default_rng(derive_seed(seed, step, "prompts"))
    return rng.choice(pool, size=n, replace=False).tolist()
