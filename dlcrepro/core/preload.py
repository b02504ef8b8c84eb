"""What a training job imports before it works: the heavy third-party modules the fork server
imports once for its children (server.py), and a job in its own process imports first, so that its
start-up (celldir: `startup_seconds`) holds every import and its phases none."""

from __future__ import annotations

# the heavy third-party modules of a training job: the fork server imports them before it listens
PRELOAD = (
    "torch",
    "numpy",
    "pandas",
    "pyarrow.parquet",
    "yaml",
    "tqdm",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.inputs",
    "vllm.v1.engine.llm_engine",
    "vllm.model_executor.models.qwen3",
    # what an engine start imports on CPU (~0.6 s per job when left to the child)
    "vllm.v1.worker.cpu_worker",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.attention.backends.cpu_attn",
    "vllm.model_executor.layers.quantization.online.fp8",
    "compressed_tensors",
)


def import_job_modules() -> None:
    """Import PRELOAD and the trackers a study that logs to them names (the workflow's
    DLCREPRO_TRACKING): what the server's children inherit, and what a training job in its own
    process imports before its clock starts (celldir.run_cell). Instant where they are imported."""
    import importlib

    from .tracking import from_env, modules_to_preload

    for name in (*PRELOAD, *modules_to_preload(from_env())):
        importlib.import_module(name)
