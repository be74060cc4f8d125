# Merges: base and fine-tune interpolated, one job per ratio; optionally the ratio chosen on a dev
# split that no reported table uses; and a LoRA / QLoRA training job's adapter merged into the
# checkpoint it trained from (stillroom/stages/merge.py).


# One CPU job per training job with an adapter: streamed shard by shard in float32 into the
# full-precision base (for QLoRA the original checkpoint, never NF4 weights), so memory holds the
# adapter and one tensor, and the output is sharded like the base.
if PLAN.adapter:

    rule merge_adapter:
        input:
            **consumed(
                base=lambda w: PLAN.adapter_base(w.trained),
                adapter=PLAN.checkpoint("{trained}.adapter"),
            ),
        output:
            **tracked(model=directory(PLAN.checkpoint("{trained}"))),
        params:
            stage_params=stillroom.stages.merge.adapter_job_params(EXPERIMENT).as_param(),
        threads: 1
        resources:
            gpu=0,
        log:
            PLAN.log("merge-adapter-{trained}"),
        benchmark:
            timing("merge_adapter", "{trained}")
        conda:
            ENV
        wildcard_constraints:
            trained=one_of(PLAN.trained),
        shell:
            stillroom_cli("merge_adapter")


# keyed by the merge's model name (ckpt/merge-<ratio>), whose identity gives its ratio
rule merge:
    input:
        **consumed(base=PLAN.checkpoint("base"), tuned=PLAN.checkpoint("sft")),
    output:
        **tracked(model=directory(PLAN.checkpoint("{merge}"))),
    params:
        stage_params=lambda w: stillroom.stages.merge.job_params(EXPERIMENT, w.merge).as_param(),
    resources:
        mem_mb=PLAN.student_mem_mb("merge"),  # base and fine-tune: the student's size
    log:
        PLAN.log("{merge}"),
    benchmark:
        PLAN.path("timing", job="{merge}")
    conda:
        ENV
    shell:
        stillroom_cli("merge")


if PLAN.select_on:

    rule select_merge:
        input:
            **consumed(
                graded=list(PLAN.dev_graded().values()),
                dev=PLAN.benchmark_file(PLAN.select_on),
                reported=list(PLAN.reported().values()),
            ),
        output:
            **tracked(merge_choice=PLAN.path("merge_choice")),
        params:
            stage_params=stillroom.stages.merge.select_job_params(EXPERIMENT).as_param(),
            graded=named(PLAN.dev_graded()),
            reported=named(PLAN.reported()),
        log:
            PLAN.log("select-merge"),
        benchmark:
            timing("select_merge")
        conda:
            ENV
        shell:
            stillroom_cli("select_merge")
