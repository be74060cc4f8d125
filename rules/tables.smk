# Stage 11: paired bootstrap tables (vs base and vs the fine-tune) and the accuracy/length plot.


def graded_models(bench):
    return {m: f"{R}/eval/{m}/{bench}/graded.jsonl" for m in MODELS}


rule tables:
    input:
        lambda w: list(graded_models(w.bench).values()),
    output:
        **tracked(markdown=f"{R}/tables/{{bench}}.md", csv=f"{R}/tables/{{bench}}.csv", plot=f"{R}/tables/{{bench}}.png"),
    params:
        p=lambda w: as_json(benchmark=w.bench, base="base", tuned="sft", **config["tables"]),
        graded=lambda w: named(graded_models(w.bench)),
    log:
        f"{R}/logs/tables-{{bench}}.log",
    shell:
        "stillroom tables --graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
        " --out-plot {output.plot}" + STAGE_ARGS
