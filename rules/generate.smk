# Stages 4-5: teacher samples per (teacher, effort, shard), then grading.


def generation_params(wildcards):
    gen = config["generation"]
    return as_json(teacher=wildcards.teacher, spec=config["teachers"][wildcards.teacher],
                   effort=wildcards.effort, samples=gen["samples_per_prompt"])


rule generate:
    input:
        f"{R}/shards/shard-{{shard}}.jsonl",
    output:
        **tracked(samples=f"{R}/gen/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
    params:
        p=generation_params,
    log:
        f"{R}/logs/generate/{{teacher}}-{{effort}}-{{shard}}.log",
    shell:
        "stillroom generate --shard {input} --out-samples {output.samples}" + STAGE_ARGS


rule grade_generation:
    input:
        f"{R}/gen/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl",
    output:
        **tracked(graded=f"{R}/graded/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
    params:
        p=as_json(),
    log:
        f"{R}/logs/grade/{{teacher}}-{{effort}}-{{shard}}.log",
    shell:
        "stillroom grade --samples {input} --out-graded {output.graded}" + STAGE_ARGS
