"""What a grid asks of a cluster before anything runs: its jobs, their resources and cost, the
weights and data they read from the local cache, and the device check each job makes first.
One module per concern, each importing only those above it:

    cells.py      the grid's cells (`GridCell`), the ones that copy another's run, the jobs they share
    costs.py      the cost model: minutes of a job on one H200
    resources.py  a job's Slurm resources by job kind (`job_resources`): the rules' and the plan's
    memory.py     the peak memory of a training job, by part
    device.py     a job that asks for a GPU stops where torch has none (`check_device`)
    cache.py      the weights and data the jobs read from the Hugging Face cache, and what is missing
    calibrate.py  the plan calibrated from the jobs that ran (`plan --calibrate`), the pilot's jobs
    plan.py       the plan's text (`python -m dlcrepro plan`, the Snakefile's)

Torch-free (like grid.py and config.py): the Snakefile imports it to lay out the DAG and print the
plan, also from a Snakemake environment without torch. `check_device` imports torch only when a
job asks for a GPU. The names below are the package's: `from dlcrepro.cluster import check_device`.
"""

from .calibrate import (
    CALIBRATION_FILE,
    calibration_path,
    PILOT_DIR,
    PILOT_OVERRIDES,
    CalibrationError,
    calibration,
    calibration_text,
    load_calibration,
    measurements,
    pilot_cells,
    pilot_initial_eval_jobs,
    pilot_rollouts_jobs,
    project,
    projection_error_totals,
    projection_errors,
)
from .cache import Need, blocking, checkpoint_problem, missing_message, needs
from .cells import (
    GridCell,
    copy_source,
    finished,
    grid_cells,
    initial_eval_jobs,
    rollouts_jobs,
    rollouts_topk,
    scan_corrections,
)
from .costs import (
    COST_MODEL,
    ENGINE_START_S,
    RESPONSE_TOKENS,
    StepCost,
    estimated_minutes,
    eval_answers_per_eval,
    failure_minutes,
    initial_eval_minutes,
    rollouts_minutes,
    shared_sampling_minutes,
    step_cost,
)
from .device import DeviceError, check_device
from .memory import (
    GPU_GIB,
    HEAD_INPUT_BYTES,
    LAYER_BYTES,
    LOGIT_BYTES,
    OUTSIDE_LAYERS_BYTES,
    PROMPT_TOKENS,
    PeakMemory,
    param_count,
    peak_memory,
    worst_peak_memory,
)
from .plan import SLURM_PROFILE, failure_lines, load_merged, memory_line, plan_text, profile_retries
from .resources import COPY_RESOURCES, JOBS, TRAIN_DEFAULTS, gpu_key, gres, job_resources

__all__ = [
    "CALIBRATION_FILE", "calibration_path", "PILOT_DIR", "PILOT_OVERRIDES", "CalibrationError", "calibration", "calibration_text",
    "load_calibration",
    "measurements", "pilot_cells", "pilot_initial_eval_jobs", "pilot_rollouts_jobs", "project", "projection_error_totals",
    "projection_errors",
    "COPY_RESOURCES", "COST_MODEL", "ENGINE_START_S", "GPU_GIB", "HEAD_INPUT_BYTES", "JOBS", "LAYER_BYTES", "LOGIT_BYTES",
    "OUTSIDE_LAYERS_BYTES", "PROMPT_TOKENS", "RESPONSE_TOKENS", "TRAIN_DEFAULTS", "DeviceError", "GridCell", "Need",
    "PeakMemory", "StepCost", "blocking", "check_device", "checkpoint_problem", "copy_source", "estimated_minutes",
    "eval_answers_per_eval", "failure_minutes",
    "finished", "gpu_key", "gres", "grid_cells", "initial_eval_jobs", "initial_eval_minutes",
    "SLURM_PROFILE", "failure_lines", "profile_retries",
    "job_resources", "load_merged", "memory_line", "missing_message", "needs", "param_count", "peak_memory", "plan_text",
    "rollouts_jobs", "rollouts_minutes", "rollouts_topk", "scan_corrections", "shared_sampling_minutes", "step_cost",
    "worst_peak_memory",
]
