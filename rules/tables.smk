# Tables per benchmark: paired bootstrap tables (against the base and the fine-tune) and the
# accuracy/length plot; accuracy against thinking budget, forcing against the hard cutoff of the
# same samples; the kernel track's rates; and, when generation.effort_teachers gives efforts to
# different teachers, their trace lengths compared (stillroom/stages/tables.py).

SELECTION = PLAN.selection
SELECTION_ARG = f" --selection {SELECTION[0]}" if SELECTION else ""


rule tables:
    input:
        **consumed(graded=lambda w: list(PLAN.graded_models(w.bench).values()), selection=SELECTION),
    output:
        **tracked(
            markdown=f"{R}/tables/{{bench}}.md",
            csv=report(
                f"{R}/tables/{{bench}}.csv",
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "paired comparisons"},
            ),
            html=report(
                f"{R}/tables/{{bench}}.html",
                caption="../report/table.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "paired comparisons"},
            ),
            latex=f"{R}/tables/{{bench}}.tex",
            plot=report(
                f"{R}/tables/{{bench}}.png",
                caption="../report/plot.rst",
                category="Plots",
                labels={"benchmark": "{bench}", "plot": "accuracy vs tokens"},
            ),
        ),
    params:
        p=lambda w: stillroom.stages.tables.job_params(EXPERIMENT, w.bench, BASE_RANDOM).as_param(),
        graded=lambda w: named(PLAN.graded_models(w.bench)),
    log:
        f"{R}/logs/tables-{{bench}}.log",
    benchmark:
        timing("tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "tables",
            "tables",
            "--graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
            " --out-html {output.html}"
            f" --out-latex {{output.latex}} --out-plot {{output.plot}}{SELECTION_ARG}",
        )


rule budget_tables:
    input:
        **consumed(graded=lambda w: list(PLAN.budget_graded(w.bench).values())),
    output:
        **tracked(
            markdown=f"{R}/tables/{{bench}}-budgets.md",
            csv=report(
                f"{R}/tables/{{bench}}-budgets.csv",
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "thinking budgets"},
            ),
            html=report(
                f"{R}/tables/{{bench}}-budgets.html",
                caption="../report/budgets.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "thinking budgets"},
            ),
            plot=report(
                f"{R}/tables/{{bench}}-budgets.png",
                caption="../report/budgets.rst",
                category="Plots",
                labels={"benchmark": "{bench}", "plot": "accuracy vs budget"},
            ),
        ),
    params:
        p=lambda w: stillroom.stages.tables.budget_job_params(
            EXPERIMENT, w.bench, BASE_RANDOM
        ).as_param(),
        graded=lambda w: named(PLAN.budget_graded(w.bench)),
    log:
        f"{R}/logs/budget-tables-{{bench}}.log",
    benchmark:
        timing("budget_tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "budget_tables",
            "budget_tables",
            "--graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
            " --out-html {output.html}"
            " --out-plot {output.plot}",
        )


rule effort_tables:
    input:
        **consumed(
            graded=lambda w: list(PLAN.effort_graded(w.bench).values()),
            teacher=list(PLAN.graded_shards().values()),
        ),
    output:
        **tracked(
            markdown=f"{R}/tables/{{bench}}-efforts.md",
            csv=report(
                f"{R}/tables/{{bench}}-efforts.csv",
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "per effort"},
            ),
            html=report(
                f"{R}/tables/{{bench}}-efforts.html",
                caption="../report/efforts.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "per effort"},
            ),
        ),
    params:
        p=lambda w: stillroom.stages.tables.effort_job_params(EXPERIMENT, w.bench).as_param(),
        graded=lambda w: named(PLAN.effort_graded(w.bench)),
        teacher=named(PLAN.graded_shards()),
    log:
        f"{R}/logs/effort-tables-{{bench}}.log",
    benchmark:
        timing("effort_tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "effort_tables",
            "effort_tables",
            "--graded {params.graded} --teacher {params.teacher}"
            " --out-markdown {output.markdown} --out-csv {output.csv} --out-html {output.html}",
        )


# "tables/{bench}.md" would also match "tables/<bench>-budgets.md" and "tables/<bench>-efforts.md"
ruleorder: budget_tables > tables
ruleorder: effort_tables > tables


rule kernel_tables:
    input:
        **consumed(graded=lambda w: list(PLAN.graded_models(w.bench).values())),
    output:
        **tracked(
            markdown=f"{R}/tables/{{bench}}-kernels.md",
            csv=report(
                f"{R}/tables/{{bench}}-kernels.csv",
                category="Tables (CSV)",
                labels={"benchmark": "{bench}", "table": "kernel metrics"},
            ),
            html=report(
                f"{R}/tables/{{bench}}-kernels.html",
                caption="../report/kernels.rst",
                category="Tables",
                labels={"benchmark": "{bench}", "table": "kernel metrics"},
            ),
        ),
    params:
        p=lambda w: stillroom.stages.tables.kernel_job_params(
            EXPERIMENT, w.bench, BASE_RANDOM
        ).as_param(),
        graded=lambda w: named(PLAN.graded_models(w.bench)),
    log:
        f"{R}/logs/kernel-tables-{{bench}}.log",
    benchmark:
        timing("kernel_tables", "{bench}")
    conda:
        ENV
    shell:
        stillroom_cli(
            "kernel_tables",
            "kernel_tables",
            "--graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
            " --out-html {output.html}",
        )


ruleorder: kernel_tables > tables  # "tables/{bench}.md" would also match "tables/<bench>-kernels.md"


# Only a config whose efforts go to more than one teacher has this table (and the target in rule all).
if PLAN.generation.mixed:

    rule teacher_tables:
        input:
            **consumed(graded=list(PLAN.graded_shards().values())),
        output:
            **tracked(
                markdown=PLAN.teachers_md,
                csv=report(
                    PLAN.teachers_md.removesuffix(".md") + ".csv",
                    category="Tables (CSV)",
                    labels={"table": "teachers"},
                ),
                html=report(
                    PLAN.teachers_md.removesuffix(".md") + ".html",
                    caption="../report/teachers.rst",
                    category="Tables",
                    labels={"table": "teachers"},
                ),
            ),
        params:
            p=stillroom.stages.tables.teacher_job_params(EXPERIMENT).as_param(),
            graded=named(PLAN.graded_shards()),
        log:
            f"{R}/logs/teacher-tables.log",
        benchmark:
            timing("teacher_tables")
        conda:
            ENV
        shell:
            stillroom_cli(
                "teacher_tables",
                "teacher_tables",
                "--graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
                " --out-html {output.html}",
            )

    ruleorder: teacher_tables > tables  # "tables/{bench}.md" would also match "tables/teachers.md"
