"""What each kind of job's results depend on: the slice of the config a warm start or a training
cell reads, the file its rule takes as input (`results/_config/<model>.yaml`,
`results/_config/<model>.warmstart.yaml`), rewritten only when its text changes
(`util.write_text_if_changed`), so that its modification time is the rerun trigger
(docs/workflow.md). Editing a plot option or a Slurm resource reruns nothing (except a cell's GPU
count: the device it trains on); editing `train.lr` reruns every cell but not the warm start.
Torch-free: workflow/rules/common.smk calls it while it is parsed."""

from __future__ import annotations

from pathlib import Path

import yaml

JOB_SECTIONS = {
    "warmstart": ("name", "artifacts", "task", "engine"),
    "train": ("name", "artifacts", "task", "engine", "train"),
}


def job_config_text(config: dict, model: str, job: str, gpus: int) -> str:
    """The sections of `config` (as Snakemake merged it) that `job` (warmstart, train) of `model`
    depends on, as YAML: the model's entry without its Slurm resources (nor, for the warm start, its
    `train` overrides), but with a training cell's GPU count where it asks for GPUs (the job checks
    it has them: cluster.check_device)."""
    sub = {k: config[k] for k in JOB_SECTIONS[job] if k in config}
    skip = {"resources"} | ({"train"} if job == "warmstart" else set())
    sub["models"] = {model: {k: v for k, v in config["models"][model].items() if k not in skip}}
    if job == "train" and gpus > 0:
        sub["models"][model]["resources"] = {"gpu": gpus}
    return yaml.safe_dump(sub, sort_keys=True)


def job_config_file(results: str | Path, model: str, job: str) -> Path:
    return Path(results) / "_config" / (f"{model}.yaml" if job == "train" else f"{model}.{job}.yaml")
