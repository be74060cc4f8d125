# Merges: base and fine-tune interpolated, one job per ratio; optionally the ratio chosen on a dev
# split that no reported table uses; and a LoRA / QLoRA training job's adapter merged into the
# checkpoint it trained from (stillroom/stages/merge.py).


# One CPU job per training job with an adapter: streamed shard by shard in float32 into the
# full-precision base (for QLoRA the original checkpoint, never NF4 weights), so memory holds the
# adapter and one tensor, and the output is sharded like the base.
if ADAPTER:

    rule merge_adapter:
        input:
            **consumed(base=adapter_base, adapter=f"{R}/ckpt/{{trained}}.adapter"),
        output:
            **tracked(model=directory(f"{R}/ckpt/{{trained}}")),
        params:
            p=as_json(weight_hooks=WEIGHT_HOOKS),
        threads: 1
        resources:
            gpu=0,
        log:
            f"{R}/logs/merge-adapter-{{trained}}.log",
        benchmark:
            timing("merge_adapter", "{trained}")
        conda:
            ENV
        wildcard_constraints:
            trained="|".join(re.escape(name) for name in TRAINED),
        shell:
            stillroom_cli(
                "merge_adapter",
                "merge_adapter",
                "--base {input.base} --adapter {input.adapter} --out-model {output.model}",
            )


rule merge:
    input:
        **consumed(base=f"{R}/ckpt/base", tuned=f"{R}/ckpt/sft"),
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
            **consumed(
                graded=list(DEV_GRADED.values()),
                dev=SPLITS.get(SELECT_ON) or BENCHMARKS[SELECT_ON],
                reported=list(REPORTED.values()),
            ),
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
                "select_merge",
                "select_merge",
                "--graded {params.graded} --dev {input.dev} --reported {params.reported}"
                " --out-selection {output.selection}",
            )
