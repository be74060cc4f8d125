# Stages 4-5: teacher samples per (teacher, effort, shard), then grading.


def generation_params(wildcards, efforts=None):
    gen = config["generation"]
    effort = {"efforts": efforts} if efforts else {"effort": wildcards.effort}
    return as_json(teacher=wildcards.teacher, spec=config["teachers"][wildcards.teacher], **effort,
                   samples=gen["samples_per_prompt"])


def teacher_gpus(wildcards):
    """GPUs of the teacher's server inside the job (0 for an API)."""
    return backend_gpus(config["teachers"][wildcards.teacher])


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
    shell:
        "stillroom generate --shard {input.shard} --out-samples {output.samples}" + STAGE_ARGS


# Efforts in one of generation.effort_groups share a job per shard: one server start serves them all.
for group in config["generation"].get("effort_groups", []):

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
        shell:
            "stillroom generate --shard {input.shard} --out-samples "
            + " ".join(f"{{output.{e}}}" for e in group)
            + STAGE_ARGS


rule grade_generation:
    input:
        f"{R}/gen/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl",
    output:
        **tracked(graded=f"{R}/graded/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
    params:
        p=as_json(**KERNEL_GRADING),
    resources:
        gpu=KERNEL_GRADE_GPUS,
        slurm_partition=partition_for(KERNEL_GRADE_GPUS),
    log:
        f"{R}/logs/grade/{{teacher}}-{{effort}}-{{shard}}.log",
    shell:
        "stillroom grade --samples {input} --out-graded {output.graded}" + STAGE_ARGS
