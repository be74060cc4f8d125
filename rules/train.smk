# The student's fine-tune: SFT on the dataset, full, LoRA or QLoRA, on the processes of
# train.distributed (stillroom/stages/train.py), rendered with train.chat_template if set. With
# train.phases, one job of this rule per phase (ckpt/sft-<name>; the last phase's is ckpt/sft),
# each from the previous phase's checkpoint and with only its own rows and epochs in its params, so
# a change to a later phase never reruns an earlier one (paths: stillroom/plan/dag.py; params:
# stillroom/stages/train.py).
# LoRA and QLoRA jobs write the adapter, ckpt/sft<phase>.adapter; rule merge_adapter
# (rules/merge.smk), a CPU job, merges it into ckpt/sft<phase>.


rule train:
    input:
        **consumed(
            base=lambda w: PLAN.train_phase(w.phase)[1],
            dataset=PLAN.path("dataset"),
            **PLAN.chat_template,
        ),
    output:
        **tracked(model=directory(PLAN.checkpoint(f"sft{{phase}}{PLAN.trained_as}"))),
    params:
        stage_params=lambda w: stillroom.stages.train.job_params(
            EXPERIMENT, PLAN.phase_name[w.phase]
        ).as_param(),
    threads: 2
    resources:
        # each phase's nodes and GPUs: its distributed, else train.distributed
        **{
            key: lambda w, key=key: PLAN.train_resource(key, w.phase)
            for key in PLAN.train_resource_keys()
        },
        mem_mb=PLAN.student_mem_mb("train"),  # per node, from the student's size
    log:
        PLAN.log("train{phase}"),
    benchmark:
        PLAN.path("timing", job="train{phase}")
    conda:
        ENV
    wildcard_constraints:
        phase=PLAN.phase_constraint,
    shell:
        stillroom_cli("train", optional=PLAN.chat_template)


# The dataset ablation (dataset.ablation): the student fine-tuned as sft is, from the base, on each
# other selection's dataset (ckpt/select-<selection>; LoRA / QLoRA: its adapter, merged as above).
rule train_ablation:
    input:
        **consumed(
            base=PLAN.checkpoint("base"),
            dataset=PLAN.path("ablation_dataset"),
            **PLAN.chat_template,
        ),
    output:
        **tracked(model=directory(PLAN.checkpoint(f"select-{{selection}}{PLAN.trained_as}"))),
    params:
        stage_params=stillroom.stages.train.job_params(EXPERIMENT).as_param(),
    threads: 2
    resources:
        **PLAN.ablation_resources,
    log:
        PLAN.log("train-select-{selection}"),
    benchmark:
        PLAN.path("timing", job="train-select-{selection}")
    conda:
        ENV
    shell:
        stillroom_cli("train", "train_ablation", optional=PLAN.chat_template)
