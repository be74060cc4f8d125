# Teacher samples per (teacher, effort, shard), resumable (stillroom/stages/generate.py).


rule generate:
    input:
        shard=f"{R}/shards/shard-{{shard}}.jsonl",
        teacher=TEACHER_FILES,
    output:
        **tracked(samples=f"{R}/gen/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
    wildcard_constraints:
        effort="|".join(e for e in EFFORTS if e not in GROUPED) or "^$",
    params:
        p=generation_params,
    resources:
        gpu=teacher_gpus,
        nodes=1,
        slurm_partition=lambda wildcards: partition_for(teacher_gpus(wildcards)),
    log:
        f"{R}/logs/generate/{{teacher}}-{{effort}}-{{shard}}.log",
    benchmark:
        timing("generate", "{teacher}-{effort}-{shard}")
    conda:
        conda_env(TEACHER_SPEC["backend"])
    shell:
        stillroom_cli("generate", "generate", "--shard {input.shard} --out-samples {output.samples}")


# Efforts in one of generation.effort_groups share a job per shard: one server start serves them all.
for group in config["generation"]["effort_groups"]:
    group_outputs = " ".join(f"{{output.{e}}}" for e in group)

    rule:
        name:
            f"generate_{'_'.join(group)}"
        input:
            shard=f"{R}/shards/shard-{{shard}}.jsonl",
            teacher=TEACHER_FILES,
        output:
            **tracked(**{e: f"{R}/gen/{{teacher}}/{e}/shard-{{shard}}.jsonl" for e in group}),
        params:
            p=functools.partial(generation_params, efforts=group),
        resources:
            gpu=teacher_gpus,
            nodes=1,
            slurm_partition=lambda wildcards: partition_for(teacher_gpus(wildcards)),
        log:
            f"{R}/logs/generate/{{teacher}}-{'-'.join(group)}-{{shard}}.log",
        benchmark:
            timing(f"generate_{'_'.join(group)}", "{teacher}-{shard}")
        conda:
            conda_env(TEACHER_SPEC["backend"])
        shell:
            stillroom_cli(
                "generate",
                f"generate_{'_'.join(group)}",
                f"--shard {{input.shard}} --out-samples {group_outputs}",
            )
