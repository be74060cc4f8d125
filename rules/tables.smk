# Stage 11: paired bootstrap tables (vs base and vs the fine-tune) and the accuracy/length plot.


def graded_models(wildcards):
    return {m: f"{R}/eval/{m}/{wildcards.bench}/graded.jsonl" for m in MODELS}


def tables_params(wildcards):
    return as_json(benchmark=wildcards.bench, base="base", tuned="sft", **config["tables"])


SELECTION = [f"{R}/merge/selected.json"] if SELECT_ON else []


def tables_inputs(wildcards):
    return list(graded_models(wildcards).values()) + SELECTION


def tables_named_inputs(wildcards):
    return named(graded_models(wildcards))


rule tables:
    input:
        tables_inputs,
    output:
        **tracked(markdown=f"{R}/tables/{{bench}}.md", csv=f"{R}/tables/{{bench}}.csv", plot=f"{R}/tables/{{bench}}.png"),
    params:
        p=tables_params,
        graded=tables_named_inputs,
    log:
        f"{R}/logs/tables-{{bench}}.log",
    shell:
        "stillroom tables --graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
        " --out-plot {output.plot}" + (f" --selection {SELECTION[0]}" if SELECTION else "") + STAGE_ARGS
