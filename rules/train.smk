# The student's fine-tune: SFT on the dataset, full, LoRA or QLoRA, on the processes of
# train.distributed (stillroom/stages/train.py), rendered with train.chat_template if set. With
# train.stages, one job of this rule per stage (ckpt/sft-<name>; the last stage's is ckpt/sft),
# each from the previous stage's checkpoint and with only its own rows and epochs in its params, so
# a change to a later stage never reruns an earlier one (its helpers are in rules/common.smk). LoRA
# and QLoRA jobs write the adapter, ckpt/sft<stage>.adapter; rule merge_adapter (rules/merge.smk), a
# CPU job, merges it into ckpt/sft<stage>.


rule train:
    input:
        **consumed(
            base=lambda wildcards: train_stage(wildcards)[1],
            dataset=f"{R}/dataset/train.jsonl",
            **({"chat_template": repo_path(TRAIN_TEMPLATE)} if TRAIN_TEMPLATE else {}),
        ),
    output:
        **tracked(model=directory(f"{R}/ckpt/sft{{stage}}{TRAINED_AS}")),
    params:
        p=train_params,
    threads: 2
    resources:
        **TRAIN_RESOURCES,  # each stage's nodes and GPUs: its distributed, else train.distributed
    log:
        f"{R}/logs/train{{stage}}.log",
    benchmark:
        f"{R}/timing/train{{stage}}.tsv"
    conda:
        ENV
    wildcard_constraints:
        stage="|".join(f"(?:{re.escape(s)})" for s in STAGE_SUFFIX),  # "(?:)": ckpt/sft itself
    shell:
        stillroom_cli(
            "train",
            "train",
            "--base {input.base} --dataset {input.dataset} --out-model {output.model}"
            + (" --chat-template {input.chat_template:q}" if TRAIN_TEMPLATE else ""),
        )


# The dataset ablation (dataset.ablation): the student fine-tuned as sft is, from the base, on each
# other selection's dataset (ckpt/select-<selection>; LoRA / QLoRA: its adapter, merged as above).
rule train_ablation:
    input:
        **consumed(
            base=f"{R}/ckpt/base",
            dataset=f"{R}/dataset/select-{{selection}}.jsonl",
            **({"chat_template": repo_path(TRAIN_TEMPLATE)} if TRAIN_TEMPLATE else {}),
        ),
    output:
        **tracked(model=directory(f"{R}/ckpt/select-{{selection}}{TRAINED_AS}")),
    params:
        p=as_json(**TRAIN_COMMON, **TRAIN_STUDENT),
    threads: 2
    resources:
        **train_resources(config),
    log:
        f"{R}/logs/train-select-{{selection}}.log",
    benchmark:
        f"{R}/timing/train-select-{{selection}}.tsv"
    conda:
        ENV
    shell:
        stillroom_cli(
            "train",
            "train_ablation",
            "--base {input.base} --dataset {input.dataset} --out-model {output.model}"
            + (" --chat-template {input.chat_template:q}" if TRAIN_TEMPLATE else ""),
        )
