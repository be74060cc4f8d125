# Stage 8: interpolate base and fine-tuned weights, one job per ratio.


rule merge:
    input:
        base=f"{R}/ckpt/base",
        tuned=f"{R}/ckpt/sft",
    output:
        **tracked(model=directory(f"{R}/ckpt/merge-{{ratio}}")),
    params:
        p=lambda w: as_json(tuned_weight=float(w.ratio)),
    log:
        f"{R}/logs/merge-{{ratio}}.log",
    shell:
        "stillroom merge --base {input.base} --tuned {input.tuned} --out-model {output.model}" + STAGE_ARGS
