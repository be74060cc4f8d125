# Tables per benchmark: paired bootstrap tables (against the base and the fine-tune) and the
# accuracy/length plot; accuracy against thinking budget, forcing against the hard cutoff of the
# same samples; the kernel track's rates; and, when generation.effort_teachers gives efforts to
# different teachers, their trace lengths compared (stillroom/stages/tables.py).
# Every table shares tables/: each rule's {bench} is one of the benchmarks it makes tables for
# (the map rule all's targets come from), so "tables/{bench}.md" matches no other rule's file.
TABLE_BENCHMARKS = PLAN.table_benchmarks()

MERGE_CHOICE = PLAN.merge_choice


rule tables:
    wildcard_constraints:
        bench=one_of(TABLE_BENCHMARKS["tables"]),
    input:
        **consumed(
            graded=lambda w: list(PLAN.graded_models(w.bench).values()), merge_choice=MERGE_CHOICE
        ),
    output:
        **tracked(
            markdown=PLAN.path("tables", ext="md"),
            csv=report(
                PLAN.path("tables", ext="csv"),
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "paired comparisons"},
            ),
            html=report(
                PLAN.path("tables", ext="html"),
                caption="../report/table.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "paired comparisons"},
            ),
            latex=PLAN.path("tables", ext="tex"),
            plot=report(
                PLAN.path("tables", ext="png"),
                caption="../report/plot.rst",
                category="Plots",
                labels={"benchmark": "{bench}", "plot": "accuracy vs tokens"},
            ),
        ),
    params:
        stage_params=lambda w: stillroom.stages.tables.job_params(
            EXPERIMENT, w.bench, BASE_RANDOM
        ).as_param(),
        graded=lambda w: named(PLAN.graded_models(w.bench)),
    log:
        PLAN.log("tables-{bench}"),
    benchmark:
        timing("tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli("tables", optional=["merge_choice"] if MERGE_CHOICE else [])


rule budget_tables:
    wildcard_constraints:
        bench=one_of(TABLE_BENCHMARKS["budget_tables"]),
    input:
        **consumed(graded=lambda w: list(PLAN.budget_graded(w.bench).values())),
    output:
        **tracked(
            markdown=PLAN.path("budget_tables", ext="md"),
            csv=report(
                PLAN.path("budget_tables", ext="csv"),
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "thinking budgets"},
            ),
            html=report(
                PLAN.path("budget_tables", ext="html"),
                caption="../report/budgets.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "thinking budgets"},
            ),
            plot=report(
                PLAN.path("budget_tables", ext="png"),
                caption="../report/budgets.rst",
                category="Plots",
                labels={"benchmark": "{bench}", "plot": "accuracy vs budget"},
            ),
        ),
    params:
        stage_params=lambda w: stillroom.stages.tables.budget_job_params(
            EXPERIMENT, w.bench, BASE_RANDOM
        ).as_param(),
        graded=lambda w: named(PLAN.budget_graded(w.bench)),
    log:
        PLAN.log("budget-tables-{bench}"),
    benchmark:
        timing("budget_tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli("budget_tables")


rule effort_tables:
    wildcard_constraints:
        bench=one_of(TABLE_BENCHMARKS["effort_tables"]),
    input:
        **consumed(
            graded=lambda w: list(PLAN.effort_graded(w.bench).values()),
            teacher=list(PLAN.graded_shards().values()),
        ),
    output:
        **tracked(
            markdown=PLAN.path("effort_tables", ext="md"),
            csv=report(
                PLAN.path("effort_tables", ext="csv"),
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "per effort"},
            ),
            html=report(
                PLAN.path("effort_tables", ext="html"),
                caption="../report/efforts.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "per effort"},
            ),
        ),
    params:
        stage_params=lambda w: stillroom.stages.tables.effort_job_params(
            EXPERIMENT, w.bench
        ).as_param(),
        graded=lambda w: named(PLAN.effort_graded(w.bench)),
        teacher=named(PLAN.graded_shards()),
    log:
        PLAN.log("effort-tables-{bench}"),
    benchmark:
        timing("effort_tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli("effort_tables")


rule kernel_tables:
    wildcard_constraints:
        bench=one_of(TABLE_BENCHMARKS["kernel_tables"]),
    input:
        **consumed(graded=lambda w: list(PLAN.graded_models(w.bench).values())),
    output:
        **tracked(
            markdown=PLAN.path("kernel_tables", ext="md"),
            csv=report(
                PLAN.path("kernel_tables", ext="csv"),
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "kernel metrics"},
            ),
            html=report(
                PLAN.path("kernel_tables", ext="html"),
                caption="../report/kernels.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "kernel metrics"},
            ),
        ),
    params:
        stage_params=lambda w: stillroom.stages.tables.kernel_job_params(
            EXPERIMENT, w.bench, BASE_RANDOM
        ).as_param(),
        graded=lambda w: named(PLAN.graded_models(w.bench)),
    log:
        PLAN.log("kernel-tables-{bench}"),
    benchmark:
        timing("kernel_tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli("kernel_tables")


# Only a config whose efforts go to more than one teacher has this table (and the target in rule all).
if PLAN.generation.mixed:

    rule teacher_tables:
        input:
            **consumed(graded=list(PLAN.graded_shards().values())),
        output:
            **tracked(
                markdown=PLAN.teachers_md,
                csv=report(
                    PLAN.path("teacher_tables", ext="csv"),
                    category="Tables (CSV)",
                    labels={"table": "teachers"},
                ),
                html=report(
                    PLAN.path("teacher_tables", ext="html"),
                    caption="../report/teachers.rst",
                    category="Tables",
                    labels={"table": "teachers"},
                ),
            ),
        params:
            stage_params=stillroom.stages.tables.teacher_job_params(EXPERIMENT).as_param(),
            graded=named(PLAN.graded_shards()),
        log:
            PLAN.log("teacher-tables"),
        benchmark:
            timing("teacher_tables")
        conda:
            ENV
        shell:
            stillroom_cli("teacher_tables")
