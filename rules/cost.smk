# The cost ledger: API tokens x price per teacher and effort, GPU-hours per stage x the config's
# rate (stillroom/stages/cost.py).


rule cost:
    input:
        **consumed(artifacts=list(PLAN.cost_artifacts().values())),
    output:
        **tracked(
            markdown=PLAN.path("cost", ext="md"),
            csv=report(
                PLAN.path("cost", ext="csv"),
                category="Cost (CSV)",
                labels={"table": "cost ledger"},
            ),
            html=report(
                PLAN.path("cost", ext="html"),
                caption="../report/cost.rst",
                category="Cost",
                labels={"table": "cost ledger"},
            ),
        ),
    params:
        # a function: the config's server commands hold {placeholders}, not wildcards
        stage_params=lambda wildcards: stillroom.stages.cost.job_params(EXPERIMENT).as_param(),
        artifacts=named(PLAN.cost_artifacts()),
    log:
        PLAN.log("cost"),
    benchmark:
        timing("cost")
    conda:
        ENV
    shell:
        stillroom_cli("cost")
