"""One training step and what it computes with: the task (countdown, data), the model, the engine
and its weight sync (engine, kernels, quant, manifest), the corrections, the diagnostics, the
learner's maths, the checkpoint and the loop itself (train). Imports only `core`."""
