# The student's fine-tune: SFT on the dataset, full, LoRA or QLoRA, on the processes of
# train.distributed (stillroom/stages/train.py), rendered with train.chat_template if set. With
# train.stages, one job per stage, each from the previous stage's checkpoint and with only its own
# rows and epochs in its params (a change to a later stage never reruns an earlier one); the last
# stage's checkpoint is the fine-tune.
TRAIN_TEMPLATE = config["train"]["chat_template"]
TRAIN_COMMON = {k: v for k, v in config["train"].items() if k != "stages"}
TRAIN_STAGES = config["train"]["stages"] or [None]


def stage_checkpoint(i):
    last = i == len(TRAIN_STAGES) - 1
    return f"{R}/ckpt/sft" if last else f"{R}/ckpt/sft-{TRAIN_STAGES[i]['name']}"


for i, stage in enumerate(TRAIN_STAGES):

    rule:
        name:
            "train" if stage is None else f"train_{stage['name']}"
        input:
            base=f"{R}/ckpt/base" if i == 0 else stage_checkpoint(i - 1),
            dataset=f"{R}/dataset/train.jsonl",
            **({"chat_template": repo_path(TRAIN_TEMPLATE)} if TRAIN_TEMPLATE else {}),
        output:
            **tracked(model=directory(stage_checkpoint(i))),
        params:
            p=as_json(
                **{
                    **TRAIN_COMMON,
                    **({} if stage is None else {"epochs": stage["epochs"], "stage": stage}),
                },
                weight_hooks=WEIGHT_HOOKS,
            ),
        threads: 2
        resources:
            **train_resources(config),  # nodes and GPUs follow train.distributed (cluster.py)
        log:
            f"{R}/logs/train.log" if stage is None else f"{R}/logs/train-{stage['name']}.log",
        benchmark:
            timing("train", "" if stage is None else stage["name"])
        conda:
            ENV
        shell:
            stillroom_cli(
                "train",
                "train" if stage is None else f"train_{stage['name']}",
                "--base {input.base} --dataset {input.dataset} --out-model {output.model}"
                + (" --chat-template {input.chat_template:q}" if TRAIN_TEMPLATE else ""),
            )
