# Grading, of teacher samples and of evaluation samples alike: each answer by the grader of its kind
# (stillroom/stages/grade.py, stillroom/grading/).


rule grade_generation:
    input:
        **consumed(samples=f"{R}/gen/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
    output:
        **tracked(graded=f"{R}/graded/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
    params:
        p=stillroom.stages.grade.job_params(EXPERIMENT).as_param(),
    resources:
        gpu=PLAN.kernel_grade_gpus,
        slurm_partition=partition_for(PLAN.kernel_grade_gpus),
    log:
        f"{R}/logs/grade/{{teacher}}-{{effort}}-{{shard}}.log",
    benchmark:
        timing("grade_generation", "{teacher}-{effort}-{shard}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "grade", "grade_generation", "--samples {input.samples} --out-graded {output.graded}"
        )


rule grade_eval:  # {run} is model/benchmark, or model/benchmark/budget-B
    input:
        **consumed(samples=f"{R}/eval/{{run}}/samples.jsonl"),
    output:
        **tracked(graded=f"{R}/eval/{{run}}/graded.jsonl"),
    params:
        p=stillroom.stages.grade.job_params(EXPERIMENT).as_param(),
    resources:
        gpu=PLAN.kernel_grade_gpus,
        slurm_partition=partition_for(PLAN.kernel_grade_gpus),
    log:
        f"{R}/logs/grade-eval/{{run}}.log",
    benchmark:
        timing("grade_eval", "{run}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "grade", "grade_eval", "--samples {input.samples} --out-graded {output.graded}"
        )
