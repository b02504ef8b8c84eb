# Cheap local rules: per-step tables of all cells -> aggregates -> tables and figures (each one
# dlcrepro/outputs.py lists, with its report caption).
# Rerun one alone with e.g. `snakemake --forcerun figures figures/ess.png`.


localrules:
    collect,
    tables,
    figures,


rule collect:
    input:
        metrics=cell_outputs("metrics.parquet"),
        summaries=cell_outputs("summary.json"),
    output:
        steps=f"{AGG}/steps.parquet",
        runs=f"{AGG}/runs.parquet",
    log:
        f"{LOGS}/collect.log",
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
    shell:
        "{params.python} -m dlcrepro collect --out-steps {output.steps} --out-runs {output.runs} "
        "{input.summaries} > {log} 2>&1"


rule tables:
    input:
        steps=f"{AGG}/steps.parquet",
        runs=f"{AGG}/runs.parquet",
        other_machines=other_machine_findings(),
    output:
        reported_files(outputs.TABLES, TABLES),
        outputs.findings_input_files(TABLES),
    log:
        f"{LOGS}/tables.log",
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        out=output_parent,
        replicates=replicate_args(),
        other_machines=other_machine_args(other_machine_findings()),
    shell:
        "{params.python} -m dlcrepro tables --steps {input.steps} --runs {input.runs} --out {params.out} "
        "{params.replicates} {params.other_machines} > {log} 2>&1"


rule figures:
    input:
        steps=f"{AGG}/steps.parquet",
        runs=f"{AGG}/runs.parquet",
        findings=f"{TABLES}/findings.csv",  # the summary figure, findings.png, is drawn from the findings table
    output:
        reported_files(outputs.FIGURES, FIGURES),
    log:
        f"{LOGS}/figures.log",
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        out=output_parent,
    shell:
        "{params.python} -m dlcrepro figures --steps {input.steps} --runs {input.runs} --findings {input.findings} "
        "--out {params.out} > {log} 2>&1"
