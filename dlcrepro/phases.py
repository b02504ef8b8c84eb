"""The phases of a training step, by name: `train.py` times each (a run's `sec_<phase>` columns and
its summary's `seconds_by_phase`), and the calibration projects a cell's time from them
(`cluster/calibrate.py`). One list for both, so a phase timed is a phase projected. Torch-free: the
Snakefile reads the calibration at parse time."""

PHASES = ("sync", "sample", "score", "logprobs", "resync", "probe", "correction", "update", "eval", "checkpoint")
ENGINE_PHASES = ("sync", "sample")  # what a step read from shared rollouts does not pay
