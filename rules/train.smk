# The student's fine-tune: SFT on the dataset, full, LoRA or QLoRA, on the processes of
# train.distributed (stillroom/stages/train.py).


rule train:
    input:
        base=f"{R}/ckpt/base",
        dataset=f"{R}/dataset/train.jsonl",
    output:
        **tracked(model=directory(f"{R}/ckpt/sft")),
    params:
        p=as_json(**config["train"], weight_hooks=WEIGHT_HOOKS),
    threads: 2
    resources:
        **train_resources(config),  # nodes and GPUs follow train.distributed (stillroom/cluster.py)
    log:
        f"{R}/logs/train.log",
    benchmark:
        timing("train")
    conda:
        ENV
    shell:
        stillroom_cli(
            "train",
            "train",
            "--base {input.base} --dataset {input.dataset} --out-model {output.model}",
        )
