# Merges: base and fine-tune interpolated, one job per ratio; optionally the ratio chosen on a dev
# split that no reported table uses (stillroom/stages/merge.py).


rule merge:
    input:
        base=f"{R}/ckpt/base",
        tuned=f"{R}/ckpt/sft",
    output:
        **tracked(model=directory(f"{R}/ckpt/merge-{{ratio}}")),
    params:
        p=lambda wildcards: as_json(tuned_weight=float(wildcards.ratio), weight_hooks=WEIGHT_HOOKS),
    log:
        f"{R}/logs/merge-{{ratio}}.log",
    benchmark:
        timing("merge", "{ratio}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "merge", "merge", "--base {input.base} --tuned {input.tuned} --out-model {output.model}"
        )


if SELECT_ON:
    DEV_GRADED = {f"merge-{r}": f"{R}/eval/merge-{r}/{SELECT_ON}/graded.jsonl" for r in RATIOS}
    REPORTED = {b: EVAL_SPLITS.get(b) or BENCHMARKS[b] for b in config["eval"]["benchmarks"]}

    rule select_merge:
        input:
            graded=list(DEV_GRADED.values()),
            dev=SPLITS.get(SELECT_ON) or BENCHMARKS[SELECT_ON],
            reported=list(REPORTED.values()),
        output:
            **tracked(selection=f"{R}/merge/selected.json"),
        params:
            p=as_json(
                benchmark=SELECT_ON, select_by=config["merge"]["select_by"], **config["tables"]
            ),
            graded=named(DEV_GRADED),
            reported=named(REPORTED),
        log:
            f"{R}/logs/select-merge.log",
        benchmark:
            timing("select_merge")
        conda:
            ENV
        shell:
            stillroom_cli(
                "select",
                "select_merge",
                "--graded {params.graded} --dev {input.dev} --reported {params.reported}"
                " --out-selection {output.selection}",
            )
