# Stillroom: one DAG of files from raw prompt sources to paper tables.
# Each stage's rules live in rules/<stage>.smk; its logic lives in stillroom/stages/<stage>.py,
# behind `stillroom <stage>`. The config is loaded, checked and resolved in rules/common.smk: with no
# --configfile it is the embedded default, config/config.yaml; an experiment given with
# --configfile (config/experiments/*.yaml) replaces it whole, so no key of the default leaks in.
from snakemake.utils import min_version

min_version("9.19")


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/pool.smk"
include: "rules/decontam.smk"
include: "rules/serve.smk"
include: "rules/generate.smk"
include: "rules/grade.smk"
include: "rules/dataset.smk"
include: "rules/student.smk"
include: "rules/train.smk"
include: "rules/grpo.smk"
include: "rules/merge.smk"
include: "rules/evaluate.smk"
include: "rules/tables.smk"
include: "rules/cost.smk"


check_stage_rules()


rule all:
    default_target: True
    input:
        all_tables(),
