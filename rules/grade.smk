# Grading, of teacher samples and of evaluation samples alike: each answer by the grader of its kind
# (stillroom/stages/grade.py, stillroom/grading/). A teacher shard of one effort is graded from the
# generation file holding it: an effort group's job wrote one for all its efforts.


rule grade_generation:
    input:
        **consumed(samples=lambda w: PLAN.generated(w.effort, w.teacher, w.shard)),
    output:
        **tracked(graded=PLAN.path("graded_shard")),
    params:
        stage_params=lambda w: stillroom.stages.grade.job_params(
            EXPERIMENT, w.effort if PLAN.grouped(w.effort) else None
        ).as_param(),
    resources:
        gpu=PLAN.kernel_grade_gpus,
        slurm_partition=partition_for(PLAN.kernel_grade_gpus),
    log:
        PLAN.log("grade/{teacher}-{effort}-{shard}"),
    benchmark:
        timing("grade_generation", "{teacher}-{effort}-{shard}")
    conda:
        ENV
    shell:
        stillroom_cli("grade", "grade_generation")


rule grade_eval:  # {run} is model/benchmark, or model/benchmark/budget-B
    input:
        **consumed(samples=PLAN.path("samples")),
    output:
        **tracked(graded=PLAN.path("graded")),
    params:
        stage_params=stillroom.stages.grade.job_params(EXPERIMENT).as_param(),
    resources:
        gpu=PLAN.kernel_grade_gpus,
        slurm_partition=partition_for(PLAN.kernel_grade_gpus),
    log:
        PLAN.log("grade-eval/{run}"),
    benchmark:
        timing("grade_eval", "{run}")
    conda:
        ENV
    shell:
        stillroom_cli("grade", "grade_eval")
