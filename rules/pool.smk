# Benchmarks given as dataset specs, the prompt pool with its held-out test and dev splits, and the
# pool's shards (stillroom/stages/pool.py).


rule benchmark:
    output:
        **tracked(benchmark=PLAN.path("benchmark")),
    params:
        stage_params=lambda w: stillroom.stages.pool.benchmark_job_params(
            EXPERIMENT, w.bench, REPO
        ).as_param(),
    log:
        PLAN.log("benchmark-{bench}"),
    benchmark:
        timing("benchmark", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli("benchmark")


rule pool:
    input:
        **consumed(
            benchmarks=list(PLAN.benchmarks.values()),
            files=PLAN.source_files(),
            kernels=PLAN.kernel_files,
        ),
    output:
        **tracked(
            pool=PLAN.path("pool"),
            heldout=PLAN.path("heldout"),
            dev=PLAN.path("dev"),
        ),
    params:
        stage_params=stillroom.stages.pool.pool_job_params(EXPERIMENT, REPO).as_param(),
        benchmarks=named(PLAN.benchmarks),
    log:
        PLAN.log("pool"),
    benchmark:
        timing("pool")
    conda:
        ENV
    shell:
        stillroom_cli("pool")


rule shard:
    input:
        **consumed(pool=PLAN.path("decontaminated")),
    output:
        **tracked(**{f"shard{s}": p for s, p in zip(PLAN.shards, PLAN.shard_paths())}),
    params:
        stage_params=stillroom.stages.pool.shard_job_params(EXPERIMENT).as_param(),
        shards=PLAN.shard_paths(),
    log:
        PLAN.log("shard"),
    benchmark:
        timing("shard")
    conda:
        ENV
    shell:
        stillroom_cli("shard")
