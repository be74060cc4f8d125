# Benchmarks given as dataset specs, the prompt pool with its held-out test and dev splits, and the
# pool's shards (stillroom/stages/pool.py).


rule benchmark:
    output:
        **tracked(benchmark=f"{R}/benchmarks/{{bench}}.jsonl"),
    params:
        p=lambda wildcards: as_json(
            name=wildcards.bench, spec=local_path(config["benchmarks"][wildcards.bench])
        ),
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
            benchmarks=list(BENCHMARKS.values()),
            files=[s["path"] for s in SOURCES if (s.get("path") or "").endswith(LOCAL_DATA)],
            kernels=KERNEL_FILES,
        ),
    output:
        **tracked(
            pool=f"{R}/pool/pool.jsonl",
            heldout=f"{R}/pool/heldout.jsonl",
            dev=f"{R}/pool/dev.jsonl",
        ),
    params:
        p=as_json(sources=SOURCES, heldout=config["heldout"]),
        benchmarks=named(BENCHMARKS),
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
        **tracked(**{f"shard{s}": f"{R}/shards/shard-{s}.jsonl" for s in SHARDS}),
    params:
        p=as_json(shards=len(SHARDS)),
        shards=[f"{R}/shards/shard-{s}.jsonl" for s in SHARDS],
    log:
        f"{R}/logs/shard.log",
    benchmark:
        timing("shard")
    conda:
        ENV
    shell:
        stillroom_cli("shard", "shard", "--pool {input.pool} --out-shards {params.shards}")
