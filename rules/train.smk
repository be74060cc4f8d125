# Stage 7: the student (tokenizer trained on the pool, random-weight base) and its fine-tune.


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
        p=as_json(**config["train"]),
    threads: 2
    log:
        f"{R}/logs/train.log",
    shell:
        "stillroom train --base {input.base} --dataset {input.dataset} --out-model {output.model}" + STAGE_ARGS
