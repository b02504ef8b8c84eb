# dlcrepro: the study as a DAG. models x samplers x corrections x seeds -> training cells ->
# aggregates -> every table and figure. Default: the tiny CPU config; the paper:
#   snakemake --profile slurm --configfile configs/paper.yaml
from snakemake.utils import min_version

min_version("9.0")


# --configfile replaces the default instead of being merged into it (a merge would leave the
# tiny model inside the paper grid's config).
if not workflow.overwrite_configfiles:

    configfile: "configs/tiny.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/scaling.smk"
include: "workflow/rules/rehearsal.smk"
include: "workflow/rules/pilot.smk"
include: "workflow/rules/decide.smk"


show_plan()  # at parse time: a dry run with missing weights stops here (workflow/rules/common.smk)

FORK_SERVER = []


onstart:
    show_plan(on_cluster=not workflow.local_exec)
    FORK_SERVER.append(start_fork_server())
    stop_on_signals()


onsuccess:
    stop_fork_server(FORK_SERVER[0] if FORK_SERVER else None)
    say_whether_reproduced()  # the run's last lines: did it reproduce the committed study (rule reproduce)


onerror:
    stop_fork_server(FORK_SERVER[0] if FORK_SERVER else None)
    stopped_message()


rule all:
    default_target: True
    input:
        all_outputs(),
