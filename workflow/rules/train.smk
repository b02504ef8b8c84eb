# The expensive jobs: the warm start of a tiny model and one training cell per grid entry.
# Both call the package through `shell:` so that editing analysis code never reruns them.


rule warmstart:
    input:
        cfg=warmstart_config_input,
    output:
        model=f"{ARTIFACTS}/{{model}}/model/config.json",
        summary=f"{ARTIFACTS}/{{model}}/warmstart.json",
    log:
        f"{LOGS}/warmstart/{{model}}.log",
    benchmark:
        f"{BENCHMARKS}/warmstart/{{model}}.tsv"
    conda:
        TRAIN_ENV
    threads: 2
    resources:
        # what Slurm allocates must match the threads used: oversubscribed OpenMP crawls
        cpus_per_task=2,
    params:
        threads=2,  # OpenMP's, as `threads`: not capped by --cores
        python=PYTHON,
        out=output_parent,
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro warmstart --config {input.cfg} --model {wildcards.model} "
        "--out {params.out} > {log} 2>&1"


rule train:
    input:
        cfg=train_config_input,
        model=model_input,
        data=data_input,
        # a cell that computes another cell's numbers bit for bit copies them (dlcrepro/core/grid.py)
        same=same_cell_input,
        # a lagged sampler's first steps, sampled once for all its cells (dlcrepro/study/rollouts.py)
        rollouts=rollouts_input,
        # θ_0's accuracies, evaluated once per seed (dlcrepro/study/initial_eval.py)
        initial=initial_eval_input,
    output:
        metrics=f"{RESULTS}/{{model}}/{{sampler}}/{{correction}}/seed{{seed}}/metrics.parquet",
        summary=f"{RESULTS}/{{model}}/{{sampler}}/{{correction}}/seed{{seed}}/summary.json",
    log:
        f"{LOGS}/train/{{model}}/{{sampler}}/{{correction}}/seed{{seed}}.log",
    # max_rss (MB) and cpu_time (s) of the cell: what sizes mem_mb and runtime. Under the local
    # fork server the job's process is only the client (the cell runs in the server's child).
    benchmark:
        f"{BENCHMARKS}/train/{{model}}/{{sampler}}/{{correction}}/seed{{seed}}.tsv"
    conda:
        TRAIN_ENV
    # the cores the job uses, as the local scheduler counts them and as Slurm allocates them
    threads: job_resource("train", "cpus_per_task")
    resources:
        gres=job_resource("train", "gres"),
        runtime=job_resource("train", "runtime"),
        mem_mb=job_resource("train", "mem_mb"),
        cpus_per_task=job_resource("train", "cpus_per_task"),
    params:
        threads=job_threads("train"),  # OpenMP's, from the config: not capped by --cores
        python=PYTHON,
        model_dir=model_dir_arg,
        out=output_parent,
        rollouts=rollouts_arg,
        initial=initial_eval_arg,
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro train --config {input.cfg} --model {wildcards.model} "
        "--model-dir {params.model_dir} --sampler {wildcards.sampler} "
        "--correction {wildcards.correction} --seed {wildcards.seed} {params.rollouts} {params.initial} --out {params.out} > {log} 2>&1"


# θ_0's accuracies, where every cell's accuracy curve starts: the same for every sampler and
# correction of a seed (the BF16 probe engine at θ_0), so evaluated once per model and seed
# (dlcrepro/study/initial_eval.py). With the cells' threads: the engine's numbers are a cell's.
rule initial_eval:
    input:
        cfg=train_config_input,
        model=model_input,
        data=data_input,
    output:
        initial_eval_file("{model}", "{seed}"),
    log:
        f"{LOGS}/initial_eval/{{model}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/initial_eval/{{model}}/seed{{seed}}.tsv"
    conda:
        TRAIN_ENV
    threads: job_resource("initial_eval", "cpus_per_task")
    resources:
        gres=job_resource("initial_eval", "gres"),
        runtime=job_resource("initial_eval", "runtime"),
        mem_mb=job_resource("initial_eval", "mem_mb"),
        cpus_per_task=job_resource("initial_eval", "cpus_per_task"),
    params:
        threads=job_threads("initial_eval"),  # OpenMP's, from the config: not capped by --cores
        python=PYTHON,
        model_dir=model_dir_arg,
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro initial-eval --config {input.cfg} --model {wildcards.model} "
        "--model-dir {params.model_dir} --seed {wildcards.seed} --out {output} > {log} 2>&1"


# The batches every cell of a lagged sampler samples from θ_0 (its steps before the first sync),
# sampled once per model, sampler and seed, and read by those cells instead of sampling them again:
# the same numbers (dlcrepro/study/rollouts.py). Kept, not temporary: a cell rerun alone reads it again,
# and a file sampled anew would make every finished cell that read it look out of date (~20 MB each
# on the tiny study; ~1 GB on the paper's, with 20 top-k log-probs per token).
rule rollouts:
    input:
        cfg=train_config_input,
        model=model_input,
        data=data_input,
    output:
        rollouts_file("{model}", "{sampler}", "{seed}"),
    log:
        f"{LOGS}/rollouts/{{model}}/{{sampler}}/seed{{seed}}.log",
    benchmark:
        f"{BENCHMARKS}/rollouts/{{model}}/{{sampler}}/seed{{seed}}.tsv"
    conda:
        TRAIN_ENV
    threads: job_resource("rollouts", "cpus_per_task")
    resources:
        gres=job_resource("rollouts", "gres"),
        runtime=job_resource("rollouts", "runtime"),
        mem_mb=job_resource("rollouts", "mem_mb"),
        cpus_per_task=job_resource("rollouts", "cpus_per_task"),
    params:
        threads=job_threads("rollouts"),  # OpenMP's, from the config: not capped by --cores
        python=PYTHON,
        model_dir=model_dir_arg,
        topk=rollouts_topk,
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro rollouts --config {input.cfg} --model {wildcards.model} "
        "--model-dir {params.model_dir} --sampler {wildcards.sampler} --seed {wildcards.seed} --topk {params.topk} "
        "--out {output} > {log} 2>&1"
