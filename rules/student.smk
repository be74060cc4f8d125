# The student: a pretrained model (path or hub id), or for the embedded default a tokenizer trained
# on the pool and a random-weight base (stillroom/stages/student.py).


if PLAN.pretrained:

    rule pretrained:
        output:
            **tracked(model=directory(f"{R}/ckpt/base")),
        params:
            p=stillroom.stages.student.pretrained_job_params(
                EXPERIMENT, model_source(PRETRAINED, REPO)
            ).as_param(),
        log:
            f"{R}/logs/base.log",
        benchmark:
            timing("pretrained")
        conda:
            ENV
        shell:
            stillroom_cli("pretrained", "pretrained", "--out-model {output.model}")

else:

    rule tokenizer:
        input:
            **consumed(
                pool=f"{R}/pool/decontaminated.jsonl",
                # a kernel problem's reference solution is tokenizer text
                solutions=PLAN.solution_files,
            ),
        output:
            **tracked(tokenizer=directory(f"{R}/student/tokenizer")),
        params:
            p=stillroom.stages.student.tokenizer_job_params(EXPERIMENT).as_param(),
        log:
            f"{R}/logs/tokenizer.log",
        benchmark:
            timing("tokenizer")
        conda:
            ENV
        shell:
            stillroom_cli(
                "tokenizer", "tokenizer", "--pool {input.pool} --out-tokenizer {output.tokenizer}"
            )

    rule base:
        input:
            **consumed(tokenizer=f"{R}/student/tokenizer"),
        output:
            **tracked(model=directory(f"{R}/ckpt/base")),
        params:
            p=stillroom.stages.student.base_job_params(EXPERIMENT).as_param(),
        log:
            f"{R}/logs/base.log",
        benchmark:
            timing("base")
        conda:
            ENV
        shell:
            stillroom_cli(
                "base", "base", "--tokenizer {input.tokenizer} --out-model {output.model}"
            )
