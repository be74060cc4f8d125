# Benchmarks given as dataset specs, the prompt pool with its held-out test and dev splits, and the
# pool's shards (stillroom/stages/pool.py).


rule benchmark:
    output:
        **tracked(benchmark=f"{R}/benchmarks/{{bench}}.jsonl"),
    params:
        p=lambda w: stillroom.stages.pool.benchmark_job_params(EXPERIMENT, w.bench, REPO).as_param(),
    log:
        f"{R}/logs/benchmark-{{bench}}.log",
    benchmark:
        timing("benchmark", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli("benchmark", "benchmark", "--out-benchmark {output.benchmark}")


rule pool:
    input:
        **consumed(
            benchmarks=list(PLAN.benchmarks.values()),
            files=PLAN.source_files(),
            kernels=PLAN.kernel_files,
        ),
    output:
        **tracked(
            pool=f"{R}/pool/pool.jsonl",
            heldout=f"{R}/pool/heldout.jsonl",
            dev=f"{R}/pool/dev.jsonl",
        ),
    params:
        p=stillroom.stages.pool.pool_job_params(EXPERIMENT, REPO).as_param(),
        benchmarks=named(PLAN.benchmarks),
    log:
        f"{R}/logs/pool.log",
    benchmark:
        timing("pool")
    conda:
        ENV
    shell:
        stillroom_cli(
            "pool",
            "pool",
            "--benchmarks {params.benchmarks} --out-pool {output.pool}"
            " --out-heldout {output.heldout} --out-dev {output.dev}",
        )


rule shard:
    input:
        **consumed(pool=f"{R}/pool/decontaminated.jsonl"),
    output:
        **tracked(**{f"shard{s}": p for s, p in zip(PLAN.shards, PLAN.shard_paths())}),
    params:
        p=stillroom.stages.pool.shard_job_params(EXPERIMENT).as_param(),
        shards=PLAN.shard_paths(),
    log:
        f"{R}/logs/shard.log",
    benchmark:
        timing("shard")
    conda:
        ENV
    shell:
        stillroom_cli("shard", "shard", "--pool {input.pool} --out-shards {params.shards}")
