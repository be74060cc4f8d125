# Teacher samples per (teacher, effort, shard), resumable (stillroom/stages/generate.py). Each effort
# goes to its teacher (generation.effort_teachers, default generation.teacher), and each teacher to
# rules of its own (Generation.rules()): every job of a rule has one shape, which a SLURM array
# takes from its first job. A teacher's efforts outside effort_groups run one effort a job (rule
# `generate` for generation.teacher, `generate_<teacher>` for another); efforts in one of
# effort_groups share a job per shard, so one server start serves them all (rule
# `generate_<efforts>`).

for gen_rule in PLAN.generation.rules():

    if not gen_rule.grouped:

        rule:
            name:
                gen_rule.name
            input:
                **consumed(
                    shard=f"{R}/shards/shard-{{shard}}.jsonl",
                    teacher=PLAN.teacher_files(gen_rule.teacher),
                ),
            output:
                **tracked(samples=f"{R}/gen/{{teacher}}/{{effort}}/shard-{{shard}}.jsonl"),
            wildcard_constraints:
                teacher=one_of([gen_rule.teacher]),
                effort=one_of(gen_rule.efforts),
            params:
                p=lambda w: PLAN.generation_params(w.teacher, effort=w.effort),
                # the loop's values as params: a shell command is evaluated when its job runs,
                # and would see the loop variable's last value
                rule_name=gen_rule.name,
            resources:
                gpu=lambda w: PLAN.teacher_gpus(w.teacher),
                nodes=1,
                slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
            log:
                f"{R}/logs/generate/{{teacher}}-{{effort}}-{{shard}}.log",
            benchmark:
                timing(gen_rule.name, "{teacher}-{effort}-{shard}")
            conda:
                conda_env(PLAN.teacher_backend(gen_rule.teacher))
            shell:
                stillroom_cli(
                    "generate",
                    "{params.rule_name}",
                    "--shard {input.shard} --out-samples {output.samples}",
                )

    else:

        rule:
            name:
                gen_rule.name
            input:
                **consumed(
                    shard=f"{R}/shards/shard-{{shard}}.jsonl",
                    teacher=PLAN.teacher_files(gen_rule.teacher),
                ),
            output:
                **tracked(
                    **{
                        e: f"{R}/gen/{{teacher}}/{e}/shard-{{shard}}.jsonl"
                        for e in gen_rule.efforts
                    }
                ),
            wildcard_constraints:
                teacher=one_of([gen_rule.teacher]),
            params:
                p=lambda w, efforts=list(gen_rule.efforts): PLAN.generation_params(
                    w.teacher, efforts=efforts
                ),
                rule_name=gen_rule.name,
                outs=" ".join(
                    f"{R}/gen/{{teacher}}/{e}/shard-{{shard}}.jsonl" for e in gen_rule.efforts
                ),
            resources:
                gpu=lambda w: PLAN.teacher_gpus(w.teacher),
                nodes=1,
                slurm_partition=lambda w: partition_for(PLAN.teacher_gpus(w.teacher)),
            log:
                f"{R}/logs/generate/{{teacher}}-{'-'.join(gen_rule.efforts)}-{{shard}}.log",
            benchmark:
                timing(gen_rule.name, "{teacher}-{shard}")
            conda:
                conda_env(PLAN.teacher_backend(gen_rule.teacher))
            shell:
                stillroom_cli(
                    "generate",
                    "{params.rule_name}",
                    "--shard {input.shard} --out-samples {params.outs}",
                )
