# Teacher samples per (teacher, effort key, shard), resumable (stillroom/stages/generate.py). Each
# effort goes to its teacher (generation.effort_teachers, default generation.teacher), whose server
# shapes the job. {efforts} is the job's effort key (stillroom/plan/generation.py): an effort alone,
# or the efforts of one of generation.effort_groups joined by "+", generated into one file by one
# job per shard. A self-hosted teacher's jobs are clients of its server (rules/serve.smk).


rule generate:
    input:
        **consumed(
            shard=PLAN.path("shard"),
            teacher=lambda w: PLAN.teacher_files(w.teacher),
        ),
        # a self-hosted teacher's server for this shard (rule serve_teacher), shared
        server=lambda w: PLAN.teacher_service(w.teacher, w.shard),
    output:
        **tracked(samples=PLAN.path("generated")),
    wildcard_constraints:
        **PLAN.generation_constraints,
    params:
        stage_params=lambda w: stillroom.stages.generate.job_params(
            EXPERIMENT, w.teacher, PLAN.job_efforts(w.teacher, w.efforts)
        ).as_param(),
    # a client of a shared server holds no CPU, GPU or node: the server's job holds them
    threads: lambda w: 0 if PLAN.teacher_served(w.teacher) else 1
    resources:
        gpu=lambda w: 0 if PLAN.teacher_served(w.teacher) else PLAN.teacher_gpus(w.teacher),
        nodes=lambda w: 0 if PLAN.teacher_served(w.teacher) else 1,
        slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
    log:
        PLAN.log("generate/{teacher}-{efforts}-{shard}"),
    benchmark:
        timing("generate", "{teacher}-{efforts}-{shard}")
    conda:
        lambda w: conda_env(PLAN.teacher_backend(w.teacher))
    shell:
        stillroom_cli("generate", optional=PLAN.served_inputs("generate"))
