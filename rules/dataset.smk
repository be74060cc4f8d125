# The SFT dataset: the traces dataset.select picks per (prompt, effort), effort-tagged; and for each
# selection of dataset.ablation, its own dataset (stillroom/stages/dataset.py).


rule dataset:
    input:
        **consumed(graded=list(PLAN.graded_shards().values())),
    output:
        **tracked(dataset=f"{R}/dataset/train.jsonl"),
    params:
        p=stillroom.stages.dataset.job_params(EXPERIMENT).as_param(),
        graded=named(PLAN.graded_shards()),
    log:
        f"{R}/logs/dataset.log",
    benchmark:
        timing("dataset")
    conda:
        ENV
    shell:
        stillroom_cli(
            "dataset", "dataset", "--graded {params.graded} --out-dataset {output.dataset}"
        )


rule dataset_ablation:
    input:
        **consumed(graded=list(PLAN.graded_shards().values())),
    output:
        **tracked(dataset=f"{R}/dataset/select-{{selection}}.jsonl"),
    params:
        p=lambda w: stillroom.stages.dataset.job_params(EXPERIMENT, w.selection).as_param(),
        graded=named(PLAN.graded_shards()),
    log:
        f"{R}/logs/dataset-select-{{selection}}.log",
    benchmark:
        timing("dataset_ablation", "{selection}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "dataset",
            "dataset_ablation",
            "--graded {params.graded} --out-dataset {output.dataset}",
        )
