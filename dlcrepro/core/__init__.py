"""The layer every other reads: the typed config and the registries it checks names against
(samplers, corrections, trackers), the step's phases, where models and data are, the seeds, the
atomic-file helpers and the process helpers. Torch-free: the Snakefile imports it at parse time."""
