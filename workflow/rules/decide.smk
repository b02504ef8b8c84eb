# `snakemake decide`: the sequential design (dlcrepro/study/decide.py, docs/workflow.md). Look 0 reads the
# grid's cells (grid.seeds); each look is a checkpoint that computes the findings pooled over the
# seeds so far and names the cells the next batch of seeds trains, for the undecided findings only;
# the next look reads those too. The looks end when every finding is decided or stopped, or at the
# cap (decide.cap_seeds, decide.cap_gpu_hours); `decide` then writes the summary. Its helpers:
# workflow/rules/common.smk.


localrules:
    decide_collect,
    decide_look,
    decide,


rule decide_collect:
    input:
        metrics=decide_cell_files("metrics.parquet"),
        summaries=decide_cell_files("summary.json"),
    output:
        steps=f"{DECIDE}/look{{k}}/steps.parquet",
        runs=f"{DECIDE}/look{{k}}/runs.parquet",
    log:
        f"{LOGS}/decide/collect{{k}}.log",
    benchmark:
        f"{BENCHMARKS}/decide/collect{{k}}.tsv"
    wildcard_constraints:
        k=r"\d+",
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
    shell:
        "{params.python} -m dlcrepro collect --out-steps {output.steps} --out-runs {output.runs} "
        "{input.summaries} > {log} 2>&1"


checkpoint decide_look:
    input:
        steps=f"{DECIDE}/look{{k}}/steps.parquet",
        runs=f"{DECIDE}/look{{k}}/runs.parquet",
        design=decide_design_input,
        previous=decide_previous_input,
    output:
        look=decide_look_file("{k}"),
        findings=f"{DECIDE}/look{{k}}.csv",
    log:
        f"{LOGS}/decide/look{{k}}.log",
    benchmark:
        f"{BENCHMARKS}/decide/look{{k}}.tsv"
    wildcard_constraints:
        k=r"\d+",
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        previous=decide_previous_arg,
    shell:
        "{params.python} -m dlcrepro look --steps {input.steps} --runs {input.runs} --design {input.design} "
        "{params.previous} --look {wildcards.k} --out {output.look} > {log} 2>&1"


rule decide:
    input:
        decide_looks,
    output:
        f"{DECIDE}/decide.md",
    log:
        f"{LOGS}/decide/decide.log",
    benchmark:
        f"{BENCHMARKS}/decide/decide.tsv"
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
    shell:
        "{params.python} -m dlcrepro decide-summary --looks {input} --out {output} > {log} 2>&1"
