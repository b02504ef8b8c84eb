# The pilot: the cheapest jobs that measure every phase the plan's cost model uses, before the grid
# is submitted (docs/cluster.md, "Calibrate from a pilot"). Per model: its first seed's θ_0
# evaluation, its first seed's rollouts job of each lagged sampler (jobs the grid needs anyway), and
# one cell of each cost class (engine precision, top-k or none, SGD steps per batch) cut to
# cluster.PILOT_OVERRIDES' steps. Pilot cells run under RESULTS/_pilot/, never the grid's cells'
# place: a partial run is never mistaken for a finished cell. Then
# `python -m dlcrepro plan --calibrate RESULTS` projects the rest. Its helpers: workflow/rules/common.smk.


rule pilot_cell:
    input:
        cfg=train_config_input,
        model=model_input,
        data=data_input,
        initial=lambda w: initial_eval_file(w.model, w.seed),
    output:
        summary=f"{pilot_cell_dir('{model}', '{sampler}', '{correction}', '{seed}')}/summary.json",
    log:
        f"{LOGS}/pilot/{{model}}/{{sampler}}/{{correction}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/pilot/{{model}}/{{sampler}}/{{correction}}/seed{{seed}}.tsv"
    conda:
        TRAIN_ENV
    threads: job_resource("pilot", "cpus_per_task")
    resources:
        gres=job_resource("pilot", "gres"),
        runtime=job_resource("pilot", "runtime"),
        mem_mb=job_resource("pilot", "mem_mb"),
        cpus_per_task=job_resource("pilot", "cpus_per_task"),
    params:
        threads=job_threads("pilot"),  # OpenMP's, from the config: not capped by --cores
        python=PYTHON,
        model_dir=model_dir_arg,
        out=output_parent,
        pilot=PILOT_SET,
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro train --config {input.cfg} {params.pilot} --model {wildcards.model} "
        "--model-dir {params.model_dir} --sampler {wildcards.sampler} --correction {wildcards.correction} "
        "--seed {wildcards.seed} --initial {input.initial} --out {params.out} > {log} 2>&1"


rule pilot:
    input:
        pilot_targets(),
