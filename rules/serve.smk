# Servers started once per allocation (stillroom/runtime/service.py, `stillroom serve`): each
# self-hosted teacher's generation.servers, and, when eval.backend is sglang, each evaluated
# checkpoint. A server's output is a Snakemake service file, so Snakemake puts the server and every
# job that reads that file and has to run into one group: one allocation on the cluster, one server
# start, the clients at once; when the last client ends, Snakemake stops the server (SIGTERM).
# The clients (rules generate, evaluate*) hold no CPU, GPU or node of their own: a group's
# resources are its members' sum, and the server's are the allocation's.
import json

SERVICE_STARTING = """echo '{{"state": "starting"}}' > {output.service:q}"""


rule serve_teacher:
    output:
        service=service(PLAN.path("teacher_service")),
    wildcard_constraints:
        teacher=one_of(t for t in PLAN.generation.used_teachers if PLAN.teacher_served(t)),
        server=r"\d{3}",
    params:
        spec=lambda w: json.dumps(EXPERIMENT.teachers[w.teacher].server.dump()),
    resources:
        gpu=lambda w: PLAN.teacher_gpus(w.teacher),
        nodes=1,
        slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
    log:
        PLAN.log("serve/{teacher}-{server}"),
    conda:
        lambda w: conda_env(PLAN.teacher_backend(w.teacher))
    shell:
        # The service file at once (Snakemake starts the clients when it exists, and waits for it
        # only --latency-wait seconds), then exec: Snakemake's stop must reach the server's
        # parent, not a shell that would leave it running.
        f"{SERVICE_STARTING} && exec stillroom serve "
        "--name teacher:{wildcards.teacher}/{wildcards.server} "
        "--spec {params.spec:q} --out-service {output.service:q} --server-log {log:q} "
        ">> {log:q} 2>&1"


rule serve_model:
    input:
        model=PLAN.checkpoint("{model}"),
    output:
        service=service(PLAN.path("model_service")),
    params:
        spec=lambda w: json.dumps(EXPERIMENT.eval.backend.server.dump()),
    resources:
        gpu=PLAN.eval_gpus,
        nodes=1,
        mem_mb=PLAN.student_mem_mb("serve_model"),  # from the student's size
    log:
        PLAN.log("serve/model-{model}"),
    conda:
        conda_env(PLAN.eval_backend)
    shell:
        f"{SERVICE_STARTING} && exec stillroom serve "
        "--name model:{wildcards.model} --model {input.model:q} "
        "--spec {params.spec:q} --out-service {output.service:q} --server-log {log:q} "
        ">> {log:q} 2>&1"
