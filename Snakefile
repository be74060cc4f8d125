# Stillroom: one DAG of files from raw prompt sources to paper tables.
# Stages live in rules/<stage>.smk; their logic lives in the stillroom library behind `stillroom <stage>`.
from snakemake.utils import min_version

min_version("9.19")


# An experiment given with --configfile (config/experiments/*.yaml) replaces the embedded default whole,
# so no key of the default leaks into it.
if not workflow.config_settings.configfiles:

    configfile: "config/config.yaml"



report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/pool.smk"
include: "rules/generate.smk"
include: "rules/dataset.smk"
include: "rules/train.smk"
include: "rules/merge.smk"
include: "rules/evaluate.smk"
include: "rules/tables.smk"


rule all:
    default_target: True
    input:
        all_tables(),
