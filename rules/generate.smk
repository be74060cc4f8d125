# Teacher samples per (teacher, effort key, shard), resumable (stillroom/stages/generate.py). Each
# effort goes to its teacher (generation.effort_teachers, default generation.teacher), whose server
# shapes the job. {efforts} is the job's effort key (stillroom/plan/generation.py): an effort alone,
# or the efforts of one of generation.effort_groups joined by "+", generated into one file by one
# job per shard, so one server start serves them all.


rule generate:
    input:
        **consumed(
            shard=PLAN.path("shard"),
            teacher=lambda w: PLAN.teacher_files(w.teacher),
        ),
    output:
        **tracked(samples=PLAN.path("generated")),
    wildcard_constraints:
        **PLAN.generation_constraints,
    params:
        stage_params=lambda w: stillroom.stages.generate.job_params(
            EXPERIMENT, w.teacher, PLAN.job_efforts(w.teacher, w.efforts)
        ).as_param(),
    resources:
        gpu=lambda w: PLAN.teacher_gpus(w.teacher),
        nodes=1,
        slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
    log:
        PLAN.log("generate/{teacher}-{efforts}-{shard}"),
    benchmark:
        timing("generate", "{teacher}-{efforts}-{shard}")
    conda:
        lambda w: conda_env(PLAN.teacher_backend(w.teacher))
    shell:
        stillroom_cli("generate")
