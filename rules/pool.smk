# Stages 1-3: benchmarks, prompt pool and held-out split, decontamination, shards.


def benchmark_params(wildcards):
    return as_json(name=wildcards.bench, spec=local_path(config["benchmarks"][wildcards.bench]))


rule benchmark:
    output:
        **tracked(benchmark=f"{R}/benchmarks/{{bench}}.jsonl"),
    params:
        p=benchmark_params,
    log:
        f"{R}/logs/benchmark-{{bench}}.log",
    shell:
        "stillroom benchmark --out-benchmark {output.benchmark}" + STAGE_ARGS


rule pool:
    input:
        benchmarks=list(BENCHMARKS.values()),
        files=[s["path"] for s in SOURCES if s.get("path", "").endswith(LOCAL_DATA)],
        kernels=KERNEL_FILES,
    output:
        **tracked(pool=f"{R}/pool/pool.jsonl", heldout=f"{R}/pool/heldout.jsonl", dev=f"{R}/pool/dev.jsonl"),
    params:
        p=as_json(sources=SOURCES, heldout=config["heldout"]),
        benchmarks=named(BENCHMARKS),
    log:
        f"{R}/logs/pool.log",
    shell:
        "stillroom pool --benchmarks {params.benchmarks} --out-pool {output.pool} --out-heldout {output.heldout}"
        " --out-dev {output.dev}" + STAGE_ARGS


rule decontam:
    input:
        pool=f"{R}/pool/pool.jsonl",
        heldout=f"{R}/pool/heldout.jsonl",
        dev=f"{R}/pool/dev.jsonl",
        benchmarks=list(BENCHMARKS.values()),
    output:
        **tracked(clean=f"{R}/pool/decontaminated.jsonl", report=f"{R}/pool/decontam_report.json"),
    params:
        p=as_json(**config["decontam"]),
        benchmarks=named({**BENCHMARKS, **SPLITS}),
    log:
        f"{R}/logs/decontam.log",
    shell:
        "stillroom decontam --pool {input.pool} --benchmarks {params.benchmarks}"
        " --out-clean {output.clean} --out-report {output.report}" + STAGE_ARGS


rule shard:
    input:
        f"{R}/pool/decontaminated.jsonl",
    output:
        **tracked(**{f"shard{s}": f"{R}/shards/shard-{s}.jsonl" for s in SHARDS}),
    params:
        p=as_json(shards=len(SHARDS)),
        shards=[f"{R}/shards/shard-{s}.jsonl" for s in SHARDS],
    log:
        f"{R}/logs/shard.log",
    shell:
        "stillroom shard --pool {input} --out-shards {params.shards}" + STAGE_ARGS
