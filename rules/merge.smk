# Stage 8: interpolate base and fine-tuned weights, one job per ratio; optionally choose the ratio on a
# dev split that no reported table uses.


def merge_params(wildcards):
    return as_json(tuned_weight=float(wildcards.ratio), weight_hooks=WEIGHT_HOOKS)


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


if SELECT_ON:
    DEV_GRADED = {f"merge-{r}": f"{R}/eval/merge-{r}/{SELECT_ON}/graded.jsonl" for r in RATIOS}
    REPORTED = {b: SPLITS.get(b) or BENCHMARKS[b] for b in config["eval"]["benchmarks"]}

    rule select_merge:
        input:
            graded=list(DEV_GRADED.values()),
            dev=SPLITS.get(SELECT_ON) or BENCHMARKS[SELECT_ON],
            reported=list(REPORTED.values()),
        output:
            **tracked(selection=f"{R}/merge/selected.json"),
        params:
            p=as_json(benchmark=SELECT_ON),
            graded=named(DEV_GRADED),
            reported=named(REPORTED),
        log:
            f"{R}/logs/select-merge.log",
        shell:
            "stillroom select --graded {params.graded} --dev {input.dev} --reported {params.reported}"
            " --out-selection {output.selection}" + STAGE_ARGS
