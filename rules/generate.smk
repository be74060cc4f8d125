# Teacher samples per (teacher, effort, shard), resumable (stillroom/stages/generate.py). Each effort
# goes to its teacher (generation.effort_teachers, default generation.teacher); the plan names the
# rules (stillroom/plan/generation.py): a teacher's efforts outside effort_groups run one effort a
# job (rule `generate` for generation.teacher, `generate_<teacher>` for another, whose jobs have its
# server's shape); the efforts of one of effort_groups share a job per shard, so one server start
# serves them all (rule `generate_<efforts>`: Snakemake fixes a rule's output files). One body.

for gen_rule in PLAN.generation_rules():
    gen_files = PLAN.generation_files(gen_rule)

    rule:
        name:
            gen_rule.name
        input:
            **consumed(
                shard=PLAN.path("shard"),
                teacher=PLAN.teacher_files(gen_rule.teacher),
            ),
        output:
            **tracked(**gen_files["samples"]),
        wildcard_constraints:
            **PLAN.generation_constraints(gen_rule),
        params:
            stage_params=lambda w, r=gen_rule: stillroom.stages.generate.job_params(
                EXPERIMENT, w.teacher, r.job_efforts(w.get("effort"))
            ).as_param(),
            # the loop's values as params: a shell command is evaluated when its job runs, and
            # would see the loop variable's last value
            rule_name=gen_rule.name,
            samples=" ".join(gen_files["samples"].values()),
        resources:
            gpu=lambda w: PLAN.teacher_gpus(w.teacher),
            nodes=1,
            slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
        log:
            gen_files["log"],
        benchmark:
            gen_files["timing"]
        conda:
            conda_env(PLAN.teacher_backend(gen_rule.teacher))
        shell:
            stillroom_cli("generate", "{params.rule_name}")
