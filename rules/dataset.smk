# The SFT dataset: the shortest correct trace per (prompt, effort), effort-tagged
# (stillroom/stages/dataset.py).


rule dataset:
    input:
        list(graded_shards().values()),
    output:
        **tracked(dataset=f"{R}/dataset/train.jsonl"),
    params:
        p=as_json(**config["dataset"], effort_tag=config["student"]["effort_tag"]),
        graded=named(graded_shards()),
    log:
        f"{R}/logs/dataset.log",
    benchmark:
        timing("dataset")
    conda:
        ENV
    shell:
        stillroom_cli("dataset", "dataset", "--graded {params.graded} --out-dataset {output.dataset}")
