"""The phases of a training step, by name: `train.py` times each (a run's `sec_<phase>` columns and
its summary's `seconds_by_phase`), and the calibration projects a cell's time from them
(`cluster/calibrate.py`). One list for both, so a phase timed is a phase projected. Torch-free: the
Snakefile reads the calibration at parse time. Which steps run the phases not every step runs is
here too: `Schedule`."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

PHASES = ("sync", "sample", "score", "logprobs", "resync", "probe", "correction", "update", "eval", "checkpoint")
ENGINE_PHASES = ("sync", "sample")  # what a step read from shared rollouts does not pay


@dataclass(frozen=True)
class Schedule:
    """Which of a run's steps k = 1..steps run the phases not every step runs: the loop
    (`train.Trainer.step`, `train.train_steps`), the calibration's phase counts and the cost model
    read this one schedule."""

    steps: int
    probe_every: int
    eval_every: int
    ckpt_every: int  # 0: no checkpoint

    @classmethod
    def of(cls, train, **overrides: int) -> Schedule:
        """The schedule of a TrainConfig (any object with these four fields), `overrides` replacing some."""
        return cls(**{f.name: overrides.get(f.name, getattr(train, f.name)) for f in fields(cls)})

    def probes(self, k: int) -> bool:
        """Step k takes the on-policy probes: every probe_every steps, and the last (its eval needs its off-support)."""
        return k % self.probe_every == 0 or k == self.steps

    def evaluates(self, k: int) -> bool:
        """Step k measures test accuracy: every eval_every steps, and the last."""
        return k % self.eval_every == 0 or k == self.steps

    def checkpoints(self, k: int) -> bool:
        """A checkpoint is written after step k: every ckpt_every steps, not after the last."""
        return bool(self.ckpt_every) and k % self.ckpt_every == 0 and k < self.steps

    def count(self, which: Callable[[int], bool], first: int = 1) -> int:
        """How many of steps first..steps `which` (`self.probes`, ...) holds for."""
        return sum(map(which, range(first, self.steps + 1)))

    def steps_lost_at_most(self) -> int:
        """The steps a failed run can lose, redone from its last checkpoint: one checkpoint interval,
        every step without checkpoints."""
        return min(self.ckpt_every or self.steps, self.steps)
