# Stages 9-10: k samples per problem for every model on the same problems, then grading.


def eval_params(wildcards):
    ev = config["eval"]
    return as_json(model_name=wildcards.model, benchmark=wildcards.bench, samples=ev["samples"],
                   temperature=ev["temperature"], top_p=ev["top_p"], max_new_tokens=ev["max_new_tokens"],
                   batch_size=ev["batch_size"], effort=ev.get("effort"), effort_tag=config["student"]["effort_tag"])


rule evaluate:
    input:
        model=f"{R}/ckpt/{{model}}",
        problems=benchmark_file,
    output:
        **tracked(samples=f"{R}/eval/{{model}}/{{bench}}/samples.jsonl"),
    params:
        p=eval_params,
    threads: 2
    log:
        f"{R}/logs/evaluate/{{model}}-{{bench}}.log",
    shell:
        "stillroom evaluate --model {input.model} --problems {input.problems} --out-samples {output.samples}"
        + STAGE_ARGS


rule grade_eval:
    input:
        f"{R}/eval/{{model}}/{{bench}}/samples.jsonl",
    output:
        **tracked(graded=f"{R}/eval/{{model}}/{{bench}}/graded.jsonl"),
    params:
        p=as_json(),
    log:
        f"{R}/logs/grade-eval/{{model}}-{{bench}}.log",
    shell:
        "stillroom grade --samples {input} --out-graded {output.graded}" + STAGE_ARGS
