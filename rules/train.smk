# Stage 7: the student — a pretrained model (path or hub id), or for the embedded default a tokenizer
# trained on the pool and a random-weight base — and its fine-tune.


if "pretrained" in config["student"]:

    rule pretrained:
        output:
            **tracked(model=directory(f"{R}/ckpt/base")),
        params:
            p=as_json(pretrained=config["student"]["pretrained"]),
        log:
            f"{R}/logs/base.log",
        shell:
            "stillroom pretrained --out-model {output.model}" + STAGE_ARGS

else:

    rule tokenizer:
        input:
            f"{R}/pool/decontaminated.jsonl",
        output:
            **tracked(tokenizer=directory(f"{R}/student/tokenizer")),
        params:
            p=as_json(**config["student"]["tokenizer"]),
        log:
            f"{R}/logs/tokenizer.log",
        shell:
            "stillroom tokenizer --pool {input} --out-tokenizer {output.tokenizer}" + STAGE_ARGS

    rule base:
        input:
            f"{R}/student/tokenizer",
        output:
            **tracked(model=directory(f"{R}/ckpt/base")),
        params:
            p=as_json(model=config["student"]["model"]),
        log:
            f"{R}/logs/base.log",
        shell:
            "stillroom base --tokenizer {input} --out-model {output.model}" + STAGE_ARGS


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
    shell:
        "stillroom train --base {input.base} --dataset {input.dataset} --out-model {output.model}" + STAGE_ARGS


# Kernel track: GRPO from the fine-tune on the pool's kernel problems; one reward, execution x rules.
if GRPO:

    rule grpo:
        input:
            base=f"{R}/ckpt/sft",
            problems=f"{R}/pool/decontaminated.jsonl",
        output:
            **tracked(model=directory(f"{R}/ckpt/grpo")),
        params:
            p=as_json(**config["grpo"], validator=KERNEL_GRADING.get("kernel", {})),
        threads: 2
        resources:
            **train_resources(config, "grpo"),  # nodes and GPUs follow grpo.distributed, as training's
        log:
            f"{R}/logs/grpo.log",
        shell:
            "stillroom grpo --base {input.base} --problems {input.problems} --out-model {output.model}" + STAGE_ARGS
