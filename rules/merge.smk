# Stage 8: interpolate base and fine-tuned weights, one job per ratio.


def merge_params(wildcards):
    return as_json(tuned_weight=float(wildcards.ratio))


rule merge:
    input:
        base=f"{R}/ckpt/base",
        tuned=f"{R}/ckpt/sft",
    output:
        **tracked(model=directory(f"{R}/ckpt/merge-{{ratio}}")),
    params:
        p=merge_params,
    log:
        f"{R}/logs/merge-{{ratio}}.log",
    shell:
        "stillroom merge --base {input.base} --tuned {input.tuned} --out-model {output.model}" + STAGE_ARGS
