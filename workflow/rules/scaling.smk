# The noise-floor multiple against batch size at the warm start (dlcrepro/study/scan.py). Not part of the
# default target: `snakemake scaling`. One scan job per model and sampler; the table and figure of
# this scan are drawn from its raw rows into results/scaling/, beside them. The committed
# paper_tables/scaling.* and figures/scaling.* combine three scans (docs/results.md) and are
# redrawn from all three with `python -m dlcrepro scan --redraw`, never by this rule.

SCALING_SAMPLERS = ["fp8"]
# prompts per batch (the tiny study's RL pool has 64 problems); responses per prompt: the config's
SCALING_PROMPTS = [8, 16, 32, 64]
SCALING_REPS = 8
SCALING = f"{RESULTS}/scaling"


localrules:
    scaling,


rule scaling_scan:
    input:
        cfg=train_config_input,
        model=model_input,
    output:
        f"{SCALING}/{{model}}/{{sampler}}/scan.parquet",
    log:
        f"{LOGS}/scaling/{{model}}/{{sampler}}.log",
    benchmark:
        f"{BENCHMARKS}/scaling/{{model}}/{{sampler}}.tsv"
    conda:
        TRAIN_ENV
    # a scan is a few training steps' work per rung (cluster.job_resources, job kind `scan`)
    threads: job_resource("scan", "cpus_per_task")
    resources:
        gres=job_resource("scan", "gres"),
        runtime=job_resource("scan", "runtime"),
        mem_mb=job_resource("scan", "mem_mb"),
        cpus_per_task=job_resource("scan", "cpus_per_task"),
    params:
        threads=job_threads("scan"),  # OpenMP's, from the config: not capped by --cores
        python=PYTHON,
        model_dir=model_dir_arg,
        out=output_parent,
        # the grid's corrections the scan measures (cluster.scan_corrections)
        corrections=lambda wildcards: " ".join(cluster.scan_corrections(CFG, wildcards.model, wildcards.sampler)),
        prompts=" ".join(map(str, SCALING_PROMPTS)),
        reps=SCALING_REPS,
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro scan --config {input.cfg} --model {wildcards.model} "
        "--model-dir {params.model_dir} --sampler {wildcards.sampler} --corrections {params.corrections} "
        "--prompts {params.prompts} --reps {params.reps} --out {params.out} > {log} 2>&1"


rule scaling:
    input:
        expand(
            f"{SCALING}/{{model}}/{{sampler}}/scan.parquet",
            model=config["grid"]["models"],
            sampler=SCALING_SAMPLERS,
        ),
    output:
        [f"{SCALING}/scaling.{ext}" for ext in ("md", "csv", "tex")],
        f"{SCALING}/scaling_fit.csv",
        [f"{SCALING}/scaling.{ext}" for ext in ("png", "pdf")],
    log:
        f"{LOGS}/scaling.log",
    benchmark:
        f"{BENCHMARKS}/scaling.tsv"
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        out=output_parent,
    shell:
        "{params.python} -m dlcrepro scan --redraw {input} --out {params.out} --name scaling > {log} 2>&1"
