# Stages 9-10: k samples per problem for every model on the same problems, then grading.


EVAL_GPUS = backend_gpus(config["eval"].get("backend") or {"backend": "hf"})  # in-process model: 1


def eval_params(wildcards, extra=None):
    """Only what evaluation depends on. (No **kwargs: Snakemake would pass input, output, threads and
    resources into it, and a resource change, e.g. another profile, would rerun every evaluation.)"""
    ev = config["eval"]
    return as_json(model_name=wildcards.model, benchmark=wildcards.bench, samples=ev["samples"],
                   temperature=ev["temperature"], top_p=ev["top_p"], max_new_tokens=ev["max_new_tokens"],
                   request_tokens=ev.get("request_tokens"), batch_size=ev["batch_size"], effort=ev.get("effort"),
                   effort_tag=config["student"]["effort_tag"], backend=ev.get("backend"), **(extra or {}))


def budget_params(wildcards):
    force = config["eval"]["budget_force"]
    return eval_params(wildcards, {"budget": int(wildcards.budget), "answer_tokens": force.get("answer_tokens", 64),
                                   "answer_cue": force.get("answer_cue", "\nThe answer is")})


rule evaluate:
    input:
        model=f"{R}/ckpt/{{model}}",
        problems=benchmark_file,
    output:
        **tracked(samples=f"{R}/eval/{{model}}/{{bench}}/samples.jsonl"),
    params:
        p=eval_params,
    threads: 2
    resources:
        gpu=EVAL_GPUS,
        nodes=1,
    log:
        f"{R}/logs/evaluate/{{model}}-{{bench}}.log",
    shell:
        "stillroom evaluate --model {input.model} --problems {input.problems} --out-samples {output.samples}"
        + STAGE_ARGS


rule evaluate_budget:
    input:
        model=f"{R}/ckpt/{{model}}",
        problems=benchmark_file,
    output:
        **tracked(samples=f"{R}/eval/{{model}}/{{bench}}/budget-{{budget}}/samples.jsonl"),
    params:
        p=budget_params,
    threads: 2
    resources:
        gpu=EVAL_GPUS,
        nodes=1,
    log:
        f"{R}/logs/evaluate/{{model}}-{{bench}}-budget-{{budget}}.log",
    shell:
        "stillroom evaluate --model {input.model} --problems {input.problems} --out-samples {output.samples}"
        + STAGE_ARGS


rule grade_eval:  # {run} is model/benchmark, or model/benchmark/budget-B
    input:
        f"{R}/eval/{{run}}/samples.jsonl",
    output:
        **tracked(graded=f"{R}/eval/{{run}}/graded.jsonl"),
    params:
        p=as_json(letters=config["eval"].get("letters", "ABCD"), **KERNEL_GRADING),
    resources:
        gpu=KERNEL_GRADE_GPUS,
        slurm_partition=partition_for(KERNEL_GRADE_GPUS),
    log:
        f"{R}/logs/grade-eval/{{run}}.log",
    shell:
        "stillroom grade --samples {input} --out-graded {output.graded}" + STAGE_ARGS
