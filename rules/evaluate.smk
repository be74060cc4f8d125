# Evaluation: k samples per problem for every model on the same problems, at each thinking budget,
# and at each effort the student was trained with (stillroom/stages/evaluate.py); graded by rule
# grade_eval.

EVAL_BACKEND = PLAN.eval_backend
EVAL_GPUS = PLAN.eval_gpus  # an in-process model: 1
# eval.backend sglang: each checkpoint's server (rule serve_model) serves all of its evaluation jobs
# One core a job (none for a client of a shared server, whose server holds the allocation's): a
# served model computes in its server, and an in-process one on a GPU. On a CPU,
# two single-threaded evaluations of a small student beat one with two threads: each job spends its
# first seconds importing, on one core. SLURM: the profile's set-threads.
EVAL_THREADS = 0 if PLAN.eval_served else 1


rule evaluate:
    input:
        **consumed(
            model=PLAN.checkpoint("{model}"), problems=lambda w: PLAN.benchmark_file(w.bench)
        ),
        server=lambda w: PLAN.model_service(w.model),
    output:
        **tracked(samples=PLAN.eval_path("samples", "evaluate")),
    params:
        stage_params=lambda w: stillroom.stages.evaluate.job_params(
            EXPERIMENT, w.model, w.bench
        ).as_param(),
    threads: EVAL_THREADS
    resources:
        **PLAN.eval_resources("evaluate"),
    log:
        PLAN.log("evaluate/{model}-{bench}"),
    benchmark:
        timing("evaluate", "{model}-{bench}")
    conda:
        conda_env(EVAL_BACKEND)
    shell:
        stillroom_cli("evaluate", optional=PLAN.served_inputs("evaluate"))


rule evaluate_budget:
    input:
        **consumed(
            model=PLAN.checkpoint("{model}"), problems=lambda w: PLAN.benchmark_file(w.bench)
        ),
        server=lambda w: PLAN.model_service(w.model),
    output:
        **tracked(samples=PLAN.eval_path("samples", "evaluate_budget")),
    params:
        stage_params=lambda w: stillroom.stages.evaluate.budget_job_params(
            EXPERIMENT, w.model, w.bench, w.budget
        ).as_param(),
    threads: EVAL_THREADS
    resources:
        **PLAN.eval_resources("evaluate_budget"),
    log:
        PLAN.log("evaluate/{model}-{bench}-budget-{budget}"),
    benchmark:
        timing("evaluate_budget", "{model}-{bench}-{budget}")
    conda:
        conda_env(EVAL_BACKEND)
    shell:
        stillroom_cli("evaluate", "evaluate_budget", optional=PLAN.served_inputs("evaluate"))


rule evaluate_effort:
    input:
        **consumed(
            model=PLAN.checkpoint("{model}"), problems=lambda w: PLAN.benchmark_file(w.bench)
        ),
        server=lambda w: PLAN.model_service(w.model),
    output:
        **tracked(samples=PLAN.eval_path("samples", "evaluate_effort")),
    params:
        stage_params=lambda w: stillroom.stages.evaluate.effort_job_params(
            EXPERIMENT, w.model, w.bench, w.effort
        ).as_param(),
    threads: EVAL_THREADS
    resources:
        **PLAN.eval_resources("evaluate_effort"),
    log:
        PLAN.log("evaluate/{model}-{bench}-effort-{effort}"),
    benchmark:
        timing("evaluate_effort", "{model}-{bench}-{effort}")
    conda:
        conda_env(EVAL_BACKEND)
    shell:
        stillroom_cli("evaluate", "evaluate_effort", optional=PLAN.served_inputs("evaluate"))
