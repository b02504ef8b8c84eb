# Cheap local rules: per-step tables of all cells -> aggregates -> tables and figures (each one
# dlcrepro/report/outputs.py lists, with its report caption) -> whether they reproduce the committed study.
# `publish` (never in the default target) copies a finished run over the committed study.
# Rerun one alone with e.g. `snakemake --forcerun figures figures/ess.png`.


localrules:
    collect,
    tables,
    figures,
    reproduce,
    publish,


rule collect:
    input:
        metrics=cell_outputs("metrics.parquet"),
        summaries=cell_outputs("summary.json"),
    output:
        steps=f"{AGG}/steps.parquet",
        runs=f"{AGG}/runs.parquet",
    log:
        f"{LOGS}/collect.log",
    benchmark:
        f"{BENCHMARKS}/collect.tsv"
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
    benchmark:
        f"{BENCHMARKS}/tables.tsv"
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
    benchmark:
        f"{BENCHMARKS}/figures.tsv"
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        out=output_parent,
    shell:
        "{params.python} -m dlcrepro figures --steps {input.steps} --runs {input.runs} --findings {input.findings} "
        "--out {params.out} > {log} 2>&1"


rule reproduce:
    input:
        run=outputs.findings_input_files(TABLES),
        committed=committed_findings_input(),
    output:
        report=reproduction_report(),
        figure=reported_files([outputs.REPRODUCTION], FIGURES),
    log:
        f"{LOGS}/reproduce.log",
    benchmark:
        f"{BENCHMARKS}/reproduce.tsv"
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        run=input_parent,
        committed=committed_arg,
        figures=output_parent,
    shell:
        "{params.python} -m dlcrepro reproduce --run {params.run} --committed {params.committed} --out {output.report} "
        "--figure-dir {params.figures} > {log} 2>&1"


# `snakemake --cores 1 publish`: this run's tables, findings input and figures over the committed
# study's (config committed_tables_dir, committed_figures_dir). No output: it runs each time it is named.
rule publish:
    input:
        table_files(),
        figure_files(),
    log:
        f"{LOGS}/publish.log",
    conda:
        ANALYSIS_ENV
    params:
        python=PYTHON,
        tables=input_parent,
        figures=last_input_parent,
        to=publish_args,
    shell:
        "{params.python} -m dlcrepro publish --tables {params.tables} --figures {params.figures} " "{params.to} 2>&1 | tee {log}"
