# The student: a pretrained model (path or hub id), or for the embedded default a tokenizer trained
# on the pool and a random-weight base (stillroom/stages/student.py).


if PLAN.pretrained:

    rule pretrained:
        output:
            **tracked(model=directory(PLAN.checkpoint("base"))),
        params:
            stage_params=stillroom.stages.student.pretrained_job_params(
                EXPERIMENT, model_source(PRETRAINED, REPO)
            ).as_param(),
        log:
            PLAN.log("base"),
        benchmark:
            timing("pretrained")
        conda:
            ENV
        shell:
            stillroom_cli("pretrained")

else:

    rule tokenizer:
        input:
            **consumed(
                pool=PLAN.path("decontaminated"),
                # a kernel problem's reference solution is tokenizer text
                solutions=PLAN.solution_files,
            ),
        output:
            **tracked(tokenizer=directory(PLAN.path("tokenizer"))),
        params:
            stage_params=stillroom.stages.student.tokenizer_job_params(EXPERIMENT).as_param(),
        log:
            PLAN.log("tokenizer"),
        benchmark:
            timing("tokenizer")
        conda:
            ENV
        shell:
            stillroom_cli("tokenizer")

    rule base:
        input:
            **consumed(tokenizer=PLAN.path("tokenizer")),
        output:
            **tracked(model=directory(PLAN.checkpoint("base"))),
        params:
            stage_params=stillroom.stages.student.base_job_params(EXPERIMENT).as_param(),
        log:
            PLAN.log("base"),
        benchmark:
            timing("base")
        conda:
            ENV
        shell:
            stillroom_cli("base")
