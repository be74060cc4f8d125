# Decontamination: every pool prompt sharing an n-gram with a benchmark item or a split of the pool
# is dropped and reported (stillroom/stages/decontam.py).


rule decontam:
    input:
        **consumed(
            pool=f"{R}/pool/pool.jsonl",
            heldout=f"{R}/pool/heldout.jsonl",
            dev=f"{R}/pool/dev.jsonl",
            benchmarks=list(PLAN.benchmarks.values()),
        ),
    output:
        **tracked(clean=f"{R}/pool/decontaminated.jsonl", report=f"{R}/pool/decontam_report.json"),
    params:
        p=stillroom.stages.decontam.job_params(EXPERIMENT).as_param(),
        benchmarks=named({**PLAN.benchmarks, **PLAN.splits}),
    log:
        f"{R}/logs/decontam.log",
    benchmark:
        timing("decontam")
    conda:
        ENV
    shell:
        stillroom_cli(
            "decontam",
            "decontam",
            "--pool {input.pool} --benchmarks {params.benchmarks}"
            " --out-clean {output.clean} --out-report {output.report}",
        )
