"""Rules tables, budget_tables, effort_tables, kernel_tables and teacher_tables: per benchmark,
paired bootstrap tables (Markdown, CSV, LaTeX) and the accuracy-against-length plot; accuracy
against thinking budget; each trained effort against the reference effort; for the kernel track,
compile / correct / launch / rule / reward rates; and, when efforts go to different teachers, the
teachers' trace lengths on the prompts they share. The tables are computed in
stillroom/analysis/tables/ (one module per kind); this module parses each rule's params, reads its
inputs and writes its outputs.

Every model is compared with the base and with the fine-tuned model on the same problems and
sample indices; a difference whose confidence interval contains 0 is reported as a tie, and two
models that both score 0 everywhere as "both 0". The budget table sets budget forcing beside the
hard cutoff of the same samples (their ``cutoff_grade``, stages/grade.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from ..config import Effort, Experiment, Kernels, PairedTables, SeededTables, StageParams, Tables
from ..io import DataError, read_json
from .contract import stage

# The CLI imports every stage module to list the stages, every job runs the CLI, and the rules build
# each job's params with the ``*job_params`` functions here: the tables (pandas, matplotlib) are
# imported where a table is made, not here.

Params = PairedTables


def _paired(exp: Experiment, bench: str, base_random: bool) -> dict[str, Any]:
    # a paired table's settings: the models' identities give its references and the sweep's x;
    # base_random: the student's base has random weights (the caption says so)
    return {
        "seed": exp.seed,
        "benchmark": bench,
        "models": exp.model_ids,
        "base_random": base_random,
        **exp.tables.model_dump(),
    }


def job_params(exp: Experiment, bench: str, base_random: bool) -> Params:
    """The params of rule tables' job for ``bench``."""
    return Params(**_paired(exp, bench, base_random))


@stage(
    "tables",
    params=Params,
    inputs=("graded*", "merge_choice?"),
    outputs=("markdown", "csv", "html", "latex", "plot"),
    help="paired bootstrap tables and the accuracy/length plot",
)
def run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_latex: str,
    out_plot: str | None,
    out_html: str | None = None,
    params: Mapping[str, Any] | Params,
    merge_choice: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The tables of one benchmark (analysis/tables/paired.py); ``merge_choice`` (select_merge's
    JSON) marks the merge chosen on dev; no ``out_plot``, no plot (the audit's recompute compares
    the numbers only).

    Every model is compared with the base and with the fine-tune. Holm's correction runs across all
    those comparisons (they are one sweep): a difference is called only if its CI excludes 0 and its
    corrected p-value is below 1 - confidence. With one sample per problem McNemar's exact test is
    reported too.
    """
    from ..analysis.tables import paired, plots, render

    p = Params.parse(params, where="tables")
    table = paired.paired(graded, p, read_json(merge_choice) if merge_choice else None)
    markdown = render.write(
        table, out_markdown, out_csv, out_latex, out_html=out_html, params=p.model_dump(mode="json")
    )
    if out_plot:
        # each model's fine-tuned weight, the sweep's x, from the models' identities: base at 0,
        # the fine-tune at 1, a merge at its ratio
        plots.paired_plot(table, p.weights, out_plot)
    log("\n" + markdown.rstrip("\n"))
    return table.summary()


class BudgetParams(SeededTables):
    benchmark: str
    base_random: bool = PairedTables.model_fields["base_random"]


def budget_job_params(exp: Experiment, bench: str, base_random: bool) -> BudgetParams:
    """The params of rule budget_tables' job for ``bench``."""
    return BudgetParams(
        seed=exp.seed, benchmark=bench, base_random=base_random, **exp.tables.model_dump()
    )


@stage(
    "budget_tables",
    params=BudgetParams,
    inputs=("graded*",),
    outputs=("markdown", "csv", "html", "plot"),
    help="accuracy against thinking budget (budget forcing), per model",
)
def budget_run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_plot: str | None,
    out_html: str | None = None,
    params: Mapping[str, Any] | BudgetParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Accuracy against thinking budget (analysis/tables/budget.py): ``graded`` names are
    ``<model>@<budget>``. Budget forcing gave every answer its chance to answer (forced ones after
    the end-of-thinking cue); the hard cutoff row grades the same answers cut at the budget, so the
    forcing row's Δ is what forcing adds. No ``out_plot``, no plot."""
    from ..analysis.tables import budget, plots, render

    p = BudgetParams.parse(params, where="tables")
    table = budget.budgets(graded, p, p.benchmark, p.base_random)
    markdown = render.write(
        table, out_markdown, out_csv, out_html=out_html, params=p.model_dump(mode="json")
    )
    log("\n" + markdown.rstrip("\n"))
    if out_plot:
        plots.budget_plot(table.df, out_plot, p.benchmark)
    return table.summary()


class EffortParams(SeededTables):
    benchmark: str
    efforts: list[Effort] = Field(min_length=2)
    reference: Effort


def effort_job_params(exp: Experiment, bench: str) -> EffortParams:
    """The params of rule effort_tables' job for ``bench``: the generated efforts and
    eval.per_effort's reference."""
    return EffortParams(
        seed=exp.seed,
        benchmark=bench,
        efforts=list(exp.generation.efforts),
        reference=exp.eval.per_effort.reference,
        **exp.tables.model_dump(),
    )


@stage(
    "effort_tables",
    params=EffortParams,
    inputs=("graded*", "teacher*"),
    outputs=("markdown", "csv", "html"),
    help="each model at each effort it was trained with, against the reference effort",
)
def effort_run(
    *,
    graded: Mapping[str, str],
    teacher: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_html: str | None = None,
    params: Mapping[str, Any] | EffortParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The student at each effort it was trained with (analysis/tables/effort.py): ``graded``
    names are ``<model>@<effort>``, ``teacher`` the graded generation shards whose rows the table
    shows for reference."""
    from ..analysis.tables import effort, render

    p = EffortParams.parse(params, where="eval.per_effort")
    table = effort.efforts(graded, teacher, p, p.benchmark, p.efforts, p.reference)
    markdown = render.write(
        table, out_markdown, out_csv, out_html=out_html, params=p.model_dump(mode="json")
    )
    log("\n" + markdown.rstrip("\n"))
    return table.summary()


class TeacherParams(StageParams):
    """The teachers table: ``teachers`` is generation.efforts -> the teacher of each (in order),
    ``reference`` generation.teacher. One-level bootstrap over prompts (two_level does not apply:
    a prompt's failed samples leave it fewer, so samples per prompt may differ)."""

    reference: str
    teachers: dict[Effort, str] = Field(min_length=1)
    # tables.n_resamples and tables.confidence, their bounds defined once (config.Tables)
    n_resamples: int = Tables.model_fields["n_resamples"]
    confidence: float = Tables.model_fields["confidence"]


def teacher_job_params(exp: Experiment) -> TeacherParams:
    """The params of the teacher_tables job: each effort's teacher against generation.teacher."""
    gen = exp.generation
    return TeacherParams(
        seed=exp.seed,
        reference=gen.teacher,
        teachers={e: gen.teacher_of(e) for e in gen.efforts},
        n_resamples=exp.tables.n_resamples,
        confidence=exp.tables.confidence,
    )


@stage(
    "teacher_tables",
    params=TeacherParams,
    inputs=("graded*",),
    outputs=("markdown", "csv", "html"),
    help="the teachers' trace lengths per effort on the prompts they share, against the reference "
    "teacher",
)
def teacher_run(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_html: str | None = None,
    params: Mapping[str, Any] | TeacherParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trace lengths per (teacher, effort) on the prompts every one of them answered, from the
    graded generation shards (``graded``; analysis/tables/teachers.py)."""
    from ..analysis.tables import render
    from ..analysis.tables import teachers as teacher_table

    p = TeacherParams.parse(params, where="tables")
    table = teacher_table.teachers(
        graded, p.reference, p.teachers, p.n_resamples, p.confidence, p.seed
    )
    markdown = render.write(
        table, out_markdown, out_csv, out_html=out_html, params=p.model_dump(mode="json")
    )
    log("\n" + markdown.rstrip("\n"))
    return table.summary()


class KernelParams(PairedTables):
    fast_p: list[float] = Kernels.model_fields["fast_p"]


def kernel_job_params(exp: Experiment, bench: str, base_random: bool) -> KernelParams:
    """The params of rule kernel_tables' job for ``bench``: the paired table's, and
    kernels.fast_p."""
    return KernelParams(**_paired(exp, bench, base_random), fast_p=exp.kernels.fast_p)


@stage(
    "kernel_tables",
    params=KernelParams,
    inputs=("graded*",),
    outputs=("markdown", "csv", "html"),
    help="kernel track: compile, correct, launch, rule and reward rates with paired CIs; fast_p",
)
def kernel_tables(
    *,
    graded: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_html: str | None = None,
    params: Mapping[str, Any] | KernelParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The kernel track's table (analysis/tables/kernels.py)."""
    from ..analysis.tables import kernels, render

    p = KernelParams.parse(params, where="tables")
    table = kernels.table(graded, p, p.fast_p)
    markdown = render.write(
        table, out_markdown, out_csv, out_html=out_html, params=p.model_dump(mode="json")
    )
    log("\n" + markdown.rstrip("\n"))
    return table.summary()


def show(experiment_dir: str) -> None:
    """Print every result table of an experiment and where its artifacts are."""
    root = Path(experiment_dir)
    tables = sorted((root / "tables").glob("*.md"))
    if not tables:
        raise DataError(f"{root}/tables: no tables yet (run the pipeline first)")
    for t in tables:
        print(t.read_text())
    print("Artifacts:")
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        print(f"  {sub}/")
    print("Tables (the files each one has; provenance: <artifact>.prov.json):")
    for t in tables:
        # only what this table's job wrote: a budget table has no .tex, an effort table no .png
        kinds = sorted(f.suffix for f in t.parent.glob(f"{t.stem}.*") if f.suffix != ".json")
        print(f"  {t.with_suffix('')}: {', '.join(kinds)}")
