# The rehearsal's checkpoint and data set (dlcrepro/study/rehearsal.py), built into the Hugging Face cache
# where a paper job finds a downloaded model by id. Only a config whose model or data id is one of
# paths.BUILT_HERE (configs/rehearsal.yaml) asks for them; every other id must be fetched.


rule rehearsal_assets:
    output:
        model=built_here_ref(REHEARSAL_MODEL),
        dataset=built_here_ref(REHEARSAL_DATASET),
    log:
        f"{LOGS}/rehearsal_assets.log",
    benchmark:
        f"{BENCHMARKS}/rehearsal_assets.tsv"
    conda:
        TRAIN_ENV
    threads: 2
    resources:
        cpus_per_task=2,
    params:
        threads=2,  # OpenMP's, as `threads`: not capped by --cores
        python=PYTHON,
        cache=hub_cache_of,
        summary=f"{RESULTS}/_rehearsal/summary.json",
    shell:
        "OMP_NUM_THREADS={params.threads} {params.python} -m dlcrepro rehearsal --cache {params.cache} "
        "--summary {params.summary} > {log} 2>&1"
