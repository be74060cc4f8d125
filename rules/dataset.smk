# The SFT dataset: the traces dataset.select picks per (prompt, effort), effort-tagged; and for each
# selection of dataset.ablation, its own dataset (stillroom/stages/dataset.py).


rule dataset:
    input:
        **consumed(graded=list(PLAN.graded_shards().values())),
    output:
        **tracked(dataset=PLAN.path("dataset")),
    params:
        stage_params=stillroom.stages.dataset.job_params(EXPERIMENT).as_param(),
        graded=named(PLAN.graded_shards()),
    log:
        PLAN.log("dataset"),
    benchmark:
        timing("dataset")
    conda:
        ENV
    shell:
        stillroom_cli("dataset")


rule dataset_ablation:
    input:
        **consumed(graded=list(PLAN.graded_shards().values())),
    output:
        **tracked(dataset=PLAN.path("ablation_dataset")),
    params:
        stage_params=lambda w: stillroom.stages.dataset.job_params(
            EXPERIMENT, w.selection
        ).as_param(),
        graded=named(PLAN.graded_shards()),
    log:
        PLAN.log("dataset-select-{selection}"),
    benchmark:
        timing("dataset_ablation", "{selection}")
    conda:
        ENV
    shell:
        stillroom_cli("dataset", "dataset_ablation")
