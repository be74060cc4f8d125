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
        **tracked(
            markdown=f"{R}/tables/{{bench}}.md",
            csv=report(f"{R}/tables/{{bench}}.csv", caption="../report/table.rst", category="Tables",
                       labels={"benchmark": "{bench}", "table": "paired comparisons"}),
            latex=f"{R}/tables/{{bench}}.tex",
            plot=report(f"{R}/tables/{{bench}}.png", caption="../report/plot.rst", category="Plots",
                        labels={"benchmark": "{bench}", "plot": "accuracy vs tokens"}),
        ),
    params:
        p=tables_params,
        graded=tables_named_inputs,
    log:
        f"{R}/logs/tables-{{bench}}.log",
    shell:
        "stillroom tables --graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
        " --out-latex {output.latex} --out-plot {output.plot}" + (f" --selection {SELECTION[0]}" if SELECTION else "")
        + STAGE_ARGS


def budget_graded(wildcards):
    return {f"{m}@{b}": f"{R}/eval/{m}/{wildcards.bench}/budget-{b}/graded.jsonl" for m in BUDGET_MODELS for b in BUDGETS}


rule budget_tables:
    input:
        lambda wildcards: list(budget_graded(wildcards).values()),
    output:
        **tracked(
            markdown=f"{R}/tables/{{bench}}-budgets.md",
            csv=report(f"{R}/tables/{{bench}}-budgets.csv", caption="../report/budgets.rst", category="Tables",
                       labels={"benchmark": "{bench}", "table": "thinking budgets"}),
            plot=report(f"{R}/tables/{{bench}}-budgets.png", caption="../report/budgets.rst", category="Plots",
                        labels={"benchmark": "{bench}", "plot": "accuracy vs budget"}),
        ),
    params:
        p=lambda wildcards: as_json(benchmark=wildcards.bench),
        graded=lambda wildcards: named(budget_graded(wildcards)),
    log:
        f"{R}/logs/budget-tables-{{bench}}.log",
    shell:
        "stillroom budget_tables --graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
        " --out-plot {output.plot}" + STAGE_ARGS


ruleorder: budget_tables > tables  # "tables/{bench}.md" would also match "tables/<bench>-budgets.md"


# The cost ledger: API tokens x price per teacher and effort, GPU-hours per stage x config's rate.
def cost_artifacts():
    gen = {f"gen-{e}-{s}": f"{R}/gen/{TEACHER}/{e}/shard-{s}.jsonl" for e in EFFORTS for s in shards_of(e)}
    benches = config["eval"]["benchmarks"] + ([SELECT_ON] if SELECT_ON else [])
    evals = {f"eval-{m}-{b}": f"{R}/eval/{m}/{b}/samples.jsonl" for m in MODELS for b in benches
             if b in config["eval"]["benchmarks"] or m.startswith("merge-")}
    budgets = {f"budget-{m}-{b}-{B}": f"{R}/eval/{m}/{b}/budget-{B}/samples.jsonl"
               for m in BUDGET_MODELS for b in BUDGET_BENCHMARKS for B in BUDGETS}
    merges = {f"merge-{r}": f"{R}/ckpt/merge-{r}" for r in RATIOS}
    grpo = {"grpo": f"{R}/ckpt/grpo"} if GRPO else {}
    return {**gen, "train": f"{R}/ckpt/sft", **grpo, **merges, **evals, **budgets}


rule cost:
    input:
        list(cost_artifacts().values()),
    output:
        **tracked(markdown=f"{R}/cost/ledger.md",
                  csv=report(f"{R}/cost/ledger.csv", caption="../report/cost.rst", category="Cost",
                             labels={"table": "cost ledger"})),
    params:
        # GPUs per job follow the job shapes (stillroom/cluster.py); cost.gpus overrides them.
        p=as_json(**{**config.get("cost", {}), "gpus": {**stage_gpus(config), **config.get("cost", {}).get("gpus", {})}}),
        artifacts=named(cost_artifacts()),
    log:
        f"{R}/logs/cost.log",
    shell:
        "stillroom cost --artifacts {params.artifacts} --out-markdown {output.markdown} --out-csv {output.csv}"
        + STAGE_ARGS


# Kernel track: compile / correct / launch / rule / reward rates per model with paired CIs, fast_p on GPU.
rule kernel_tables:
    input:
        lambda wildcards: list(graded_models(wildcards).values()),
    output:
        **tracked(
            markdown=f"{R}/tables/{{bench}}-kernels.md",
            csv=report(f"{R}/tables/{{bench}}-kernels.csv", caption="../report/kernels.rst", category="Tables",
                       labels={"benchmark": "{bench}", "table": "kernel metrics"}),
        ),
    params:
        p=lambda wildcards: as_json(benchmark=wildcards.bench, base="base", tuned="sft", **config["tables"],
                                    fast_p=(KERNELS or {}).get("fast_p", [0.0, 1.0, 2.0])),
        graded=tables_named_inputs,
    log:
        f"{R}/logs/kernel-tables-{{bench}}.log",
    shell:
        "stillroom kernel_tables --graded {params.graded} --out-markdown {output.markdown} --out-csv {output.csv}"
        + STAGE_ARGS


ruleorder: kernel_tables > tables  # "tables/{bench}.md" would also match "tables/<bench>-kernels.md"
