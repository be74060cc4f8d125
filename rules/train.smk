# The student's fine-tune: SFT on the dataset, full, LoRA or QLoRA, on the processes of
# train.distributed (stillroom/stages/train.py), rendered with train.chat_template if set.
TRAIN_TEMPLATE = config["train"]["chat_template"]


rule train:
    input:
        base=f"{R}/ckpt/base",
        dataset=f"{R}/dataset/train.jsonl",
        **({"chat_template": repo_path(TRAIN_TEMPLATE)} if TRAIN_TEMPLATE else {}),
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
            "--base {input.base} --dataset {input.dataset} --out-model {output.model}"
            + (" --chat-template {input.chat_template:q}" if TRAIN_TEMPLATE else ""),
        )
