# Decontamination: every pool prompt sharing an n-gram with a benchmark item or a split of the pool
# is dropped and reported (stillroom/stages/decontam.py).


rule decontam:
    input:
        **consumed(
            pool=PLAN.path("pool"),
            heldout=PLAN.path("heldout"),
            dev=PLAN.path("dev"),
            benchmarks=list(PLAN.benchmarks.values()),
        ),
    output:
        **tracked(clean=PLAN.path("decontaminated"), report=PLAN.path("decontam_report")),
    params:
        stage_params=stillroom.stages.decontam.job_params(EXPERIMENT).as_param(),
        benchmarks=named({**PLAN.benchmarks, **PLAN.splits}),
    log:
        PLAN.log("decontam"),
    benchmark:
        timing("decontam")
    conda:
        ENV
    shell:
        stillroom_cli("decontam")
