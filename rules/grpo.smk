# Kernel track: GRPO from the fine-tune on the pool's kernel problems, one reward, execution x rules
# (stillroom/stages/grpo.py; the trainer: stillroom/runtime/grpo.py).


if PLAN.grpo:

    rule grpo:
        input:
            **consumed(base=PLAN.checkpoint("sft"), problems=PLAN.path("decontaminated")),
        output:
            **tracked(model=directory(PLAN.checkpoint("grpo"))),
        params:
            stage_params=stillroom.stages.grpo.job_params(EXPERIMENT).as_param(),
        threads: 2
        resources:
            **PLAN.grpo_resources,  # nodes and GPUs follow grpo.distributed
        log:
            PLAN.log("grpo"),
        benchmark:
            timing("grpo")
        conda:
            ENV
        shell:
            stillroom_cli("grpo")
