# Servers started once per allocation (stillroom/stages/serve.py, stillroom/runtime/service.py):
# each self-hosted teacher's generation.servers, and, when eval.backend is sglang, each evaluated
# checkpoint. A server's output is a Snakemake service file, so Snakemake puts the server and every
# job that reads that file and has to run into one group: one allocation on the cluster, one server
# start, the clients at once; when the last client ends, Snakemake stops the server (SIGTERM).
# The clients (rules generate, evaluate*) hold no CPU, GPU or node of their own: a group's
# resources are its members' sum, and the server's are the allocation's. No benchmark: (timing)
# file: Snakemake stops a service, which writes none, and would fail its group for the missing file.


rule serve_teacher:
    output:
        service=service(PLAN.path("teacher_service")),
    wildcard_constraints:
        teacher=one_of(t for t in PLAN.generation.used_teachers if PLAN.teacher_served(t)),
        server=r"\d{3}",
    params:
        spec=lambda w: stillroom.stages.serve.teacher_spec(EXPERIMENT, w.teacher),
    resources:
        gpu=lambda w: PLAN.teacher_gpus(w.teacher),
        nodes=1,
        slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
    log:
        PLAN.log("serve/{teacher}-{server}"),
    conda:
        lambda w: conda_env(PLAN.teacher_backend(w.teacher))
    shell:
        serve_cli("teacher:{wildcards.teacher}/{wildcards.server}")


rule serve_model:
    input:
        model=PLAN.checkpoint("{model}"),
    output:
        service=service(PLAN.path("model_service")),
    params:
        spec=lambda w: stillroom.stages.serve.model_spec(EXPERIMENT),
    resources:
        gpu=PLAN.eval_gpus,
        nodes=1,
        mem_mb=PLAN.student_mem_mb("serve_model"),  # from the student's size
    log:
        PLAN.log("serve/model-{model}"),
    conda:
        conda_env(PLAN.eval_backend)
    shell:
        serve_cli("model:{wildcards.model}", model=True)
