# Stage 6: shortest correct trace per (prompt, effort), effort-tagged.


def graded_shards():
    return {f"{e}-{s}": f"{R}/graded/{TEACHER}/{e}/shard-{s}.jsonl" for e in EFFORTS for s in shards_of(e)}


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
    shell:
        "stillroom dataset --graded {params.graded} --out-dataset {output.dataset}" + STAGE_ARGS
