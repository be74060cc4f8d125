"""A whole experiment: every section, and the checks between sections."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from . import student_model
from .base import Name, Section, Seed, Segment, tag
from .data import (
    GENERATED,
    LOCAL_DATA,
    DatasetSpec,
    Decontam,
    Heldout,
    KernelSource,
    Source,
    count_problem,
)
from .evaluation import Cost, Eval, Kernels, Tables
from .generation import DatasetSelection, Generation, ProceduralSpec, TeacherSpec
from .models import ModelId
from .training import Grpo, Merge, Student, Train, hooks_problem

# A benchmark is a JSONL file of prompt/answer/kind rows, or a dataset spec (hub id or local file).
Benchmark = Annotated[
    Annotated[str, Tag("file")] | Annotated[DatasetSpec, Tag("dataset")],
    Discriminator(lambda v: "file" if isinstance(v, str) else "dataset"),
]
tag("file", "dataset")
# carved from the pool, evaluated like benchmarks; "train" is the rest of the pool, the problems
# SFT and GRPO train on (what training did on its own problems, beside what it did on held-out ones)
SPLITS = ("heldout", "dev", "train")
# tables/<this>.{md,csv} compares the teachers of a config that mixes them across efforts
TEACHERS_TABLE = "teachers"
# tables/<benchmark><suffix>.md: a benchmark's budget, effort and kernel tables (rules/tables.smk)
TABLE_SUFFIXES = ("-budgets", "-efforts", "-kernels")


class Experiment(Section):
    """The whole config of one experiment; results go to results/<experiment>/."""

    experiment: Segment = Field(
        description="the experiment's name: its results go to results/<experiment>/"
    )
    seed: Seed = Field(
        description="the seed of every random choice of the run, recorded in each job's params"
    )
    benchmarks: dict[Name, Benchmark] = Field(
        {}, description="what the pool is decontaminated against and evaluation may report"
    )
    sources: Annotated[list[Source], Field(min_length=1)] = Field(
        description="where the prompt pool comes from, one entry a source (kind: arithmetic, "
        "choice, echo, jsonl, dataset, kernels)"
    )
    heldout: Heldout = Field(description="the held-out test and dev splits carved from the pool")
    decontam: Decontam = Field(
        Decontam(), description="n-gram decontamination of the pool against the benchmarks"
    )
    generation: Generation = Field(
        description="which teacher answers the pool at which efforts, in how many shards"
    )
    teachers: Annotated[dict[Name, TeacherSpec], Field(min_length=1)] = Field(
        description="teacher name -> how it answers (backend: procedural, openai, sglang, hf)"
    )
    dataset: DatasetSelection = Field(
        description="how the SFT dataset is chosen from the graded traces"
    )
    student: Student = Field(
        description="the student: a pretrained model, or a tokenizer and model shape built from "
        "scratch"
    )
    train: Train = Field(
        Train(), description="the supervised fine-tune of the student on the dataset"
    )
    merge: Merge = Field(
        Merge(), description="weight merges of base and fine-tune, and how one is chosen"
    )
    eval: Eval = Field(description="how every model answers the benchmarks")
    tables: Tables = Field(Tables(), description="the bootstrap confidence intervals of the tables")
    cost: Cost = Field(
        Cost(),
        description="GPU prices and counts of the cost ledger, and the figures of the estimate",
    )
    kernels: Kernels | None = Field(
        None, description="kernel track: the validator and kernel tables"
    )
    grpo: Grpo | None = Field(None, description="kernel track: GRPO from the fine-tune")

    @field_validator("benchmarks")
    @classmethod
    def _not_splits(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if name in SPLITS:
                raise ValueError(f"{name}: the name of a split of the pool; choose another")
        return value

    @property
    def model_ids(self) -> list[ModelId]:
        """Every model the tables compare, in table order, each built once here."""
        return [
            ModelId.base(),
            ModelId.sft(),
            *(ModelId.select(s) for s in self.dataset.ablation),
            *([ModelId.grpo()] if self.grpo else []),
            *(ModelId.merge(r) for r in self.merge.ratios),
        ]

    @property
    def models(self) -> list[str]:
        """The names of ``model_ids``."""
        return [m.name for m in self.model_ids]

    @model_validator(mode="after")
    def _between_sections(self) -> Experiment:
        problems = [
            *self._generation_problems(),
            *self._source_problems(),
            *self._eval_problems(),
            *self._training_problems(),
            *self._estimate_problems(),
        ]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _generation_problems(self) -> list[str]:
        gen, problems = self.generation, []
        if gen.teacher not in self.teachers:
            problems.append(
                f"generation.teacher: '{gen.teacher}' is not a key of teachers "
                f"({sorted(self.teachers)})"
            )
        if self.dataset.default_effort not in gen.efforts:
            problems.append(
                f"dataset.default_effort: '{self.dataset.default_effort}' "
                "is not in generation.efforts"
            )
        for effort, name in gen.effort_teachers.items():
            if name not in self.teachers:
                problems.append(
                    f"generation.effort_teachers.{effort}: '{name}' is not a key of teachers "
                    f"({sorted(self.teachers)})"
                )
        procedural = False
        for name in gen.used_teachers:
            teacher = self.teachers.get(name)
            if not isinstance(teacher, ProceduralSpec):
                continue
            procedural = True
            for effort in gen.efforts_of(name):
                if effort not in teacher.levels:
                    problems.append(
                        f"teachers.{name}.detail: no detail level for effort '{effort}' "
                        f"(have {sorted(teacher.levels)})"
                    )
        for i, s in enumerate(self.sources if procedural else []):
            # JSONL rows may carry the structured form (meta) the teacher answers from
            if s.kind == "dataset" or (isinstance(s, KernelSource) and (s.dir or s.path)):
                problems.append(
                    f"sources.{i} ({s.name}): the procedural teacher answers generated "
                    "problems, JSONL rows with their structured form (meta) and the project's "
                    "own kernel problems"
                )
        for i, name in enumerate(self.eval.benchmarks if gen.mixed else []):
            if name == TEACHERS_TABLE:
                problems.append(
                    f"eval.benchmarks.{i}: '{name}' would write tables/{name}.md, the table "
                    "comparing the teachers of generation.effort_teachers: rename the benchmark"
                )
        return problems

    def _source_problems(self) -> list[str]:
        problems = []
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            problems.append(f"sources: names must be unique, got {names}")
        for i, s in enumerate(self.sources):
            if s.kind == "echo" and s.benchmark not in self.benchmarks:
                problems.append(
                    f"sources.{i}.benchmark: '{s.benchmark}' is not a key of benchmarks"
                )
            if s.kind in ("arithmetic", "choice"):
                # the same check the generator makes, here before any job
                problem = count_problem(s.kind, s.count, s.max_operand)
                if problem:
                    problems.append(f"sources.{i}.count: {problem}")
        if (
            (self.heldout.size or self.heldout.dev_size)
            and not self.heldout.sources
            and not any(s.kind in GENERATED for s in self.sources)
        ):
            problems.append(
                "heldout: the held-out splits are carved from generated sources "
                f"({', '.join(GENERATED)}), and there are none: name the sources to carve them "
                "from in heldout.sources"
            )
        return problems

    def _eval_problems(self) -> list[str]:
        ev, problems = self.eval, []
        sizes = {"heldout": self.heldout.size, "dev": self.heldout.dev_size}
        for i, name in enumerate(ev.benchmarks):
            problems += self._benchmark_problem(f"eval.benchmarks.{i}", name, sizes)
        for i, phase in enumerate(self.train.phases):
            for effort in phase.efforts or []:
                if effort not in self.generation.efforts:
                    problems.append(
                        f"train.phases.{i}.efforts: '{effort}' is not one of generation.efforts "
                        f"({', '.join(self.generation.efforts)})"
                    )
        if ev.effort is not None and ev.effort not in self.generation.efforts:
            problems.append(
                f"eval.effort: '{ev.effort}' is not one of generation.efforts "
                f"({', '.join(self.generation.efforts)}): the student never saw that tag"
            )
        per = ev.per_effort
        for section, spec in (("budget_force", ev.budget_force), ("per_effort", per)):
            for key, known in (("models", self.models), ("benchmarks", ev.benchmarks)):
                for i, name in enumerate((getattr(spec, key) or []) if spec else []):
                    if name not in known:
                        problems.append(
                            f"eval.{section}.{key}.{i}: '{name}' is not one of {', '.join(known)}"
                        )
        names = [s.name for s in self.sources]
        for i, name in enumerate(self.heldout.sources or []):
            if name not in names:
                problems.append(f"heldout.sources.{i}: '{name}' is not one of {', '.join(names)}")
        if per and per.reference not in self.generation.efforts:
            problems.append(
                f"eval.per_effort.reference: '{per.reference}' is not one of generation.efforts "
                f"({', '.join(self.generation.efforts)})"
            )
        for i, name in enumerate(ev.benchmarks):
            if name.endswith(TABLE_SUFFIXES):
                problems.append(
                    f"eval.benchmarks.{i}: '{name}' ends like another table's file "
                    f"(tables/<benchmark>{{{','.join(TABLE_SUFFIXES)}}}.md): rename the benchmark"
                )
        if self.kernels and not any(s.kind == "kernels" for s in self.sources):
            problems.append(
                "kernels: the kernel track's validator and tables, but no source has kind "
                "'kernels' (the answers would be graded as kernels): drop the section"
            )
        for i, name in enumerate((self.kernels.benchmarks or []) if self.kernels else []):
            if name not in ev.benchmarks:
                problems.append(f"kernels.benchmarks.{i}: '{name}' is not one of eval.benchmarks")
        select_on = self.merge.select_on
        if select_on is not None:
            if select_on == "train":
                problems.append(
                    "merge.select_on: 'train' is what the models trained on; choose the ratio on "
                    "a held-out split"
                )
            elif select_on in ev.benchmarks:
                problems.append(
                    f"merge.select_on: '{select_on}' is also a reported benchmark "
                    "(eval.benchmarks); choose the ratio on a split no table reports"
                )
            problems += self._benchmark_problem("merge.select_on", select_on, sizes)
            if not self.merge.ratios:
                problems.append("merge.select_on: needs merge.ratios to choose from")
        return problems

    def _benchmark_problem(self, key: str, name: str, sizes: dict[str, int]) -> list[str]:
        if name == "train":
            return []
        if name in sizes:
            size_key = "size" if name == "heldout" else "dev_size"
            return [f"{key}: '{name}' needs heldout.{size_key} > 0"] if not sizes[name] else []
        if name not in self.benchmarks:
            return [f"{key}: '{name}' is neither {' nor '.join(SPLITS)} nor a key of benchmarks"]
        return []

    def _training_problems(self) -> list[str]:
        problems = []
        if self.dataset.ablation and self.train.phases:
            problems.append(
                "dataset.ablation: each selection is fine-tuned in one run of train's settings; "
                "with train.phases there is no such run (remove one of the two)"
            )
        hooks = hooks_problem(self.train.method, self.student.weight_hooks)
        if hooks:
            problems.append(f"student.weight_hooks: {hooks}")
        shape = self.student.model
        if shape and self.train.max_length > shape.max_position_embeddings:
            problems.append(
                f"train.max_length: {self.train.max_length} is more than the student's "
                f"max_position_embeddings ({shape.max_position_embeddings})"
            )
        if shape and self.eval.max_new_tokens >= shape.max_position_embeddings:
            problems.append(
                f"eval.max_new_tokens: {self.eval.max_new_tokens} leaves no room for the prompt "
                f"in the student's max_position_embeddings ({shape.max_position_embeddings})"
            )
        if shape and self.grpo and self.grpo.max_completion_length >= shape.max_position_embeddings:
            problems.append(
                f"grpo.max_completion_length: {self.grpo.max_completion_length} leaves no room "
                f"for the prompt in the student's max_position_embeddings "
                f"({shape.max_position_embeddings})"
            )
        if self.grpo and not any(s.kind == "kernels" for s in self.sources):
            problems.append(
                "grpo: trains on the pool's kernel problems, but no source has kind 'kernels'"
            )
        return problems

    @property
    def evaluated(self) -> list[str]:
        """Every benchmark (or split) some model is evaluated on: the reported ones, then the split
        the merge ratio is chosen on."""
        select_on = self.merge.select_on
        return [*self.eval.benchmarks, *([select_on] if select_on else [])]

    def _estimate_problems(self) -> list[str]:
        """The estimate's sizes name benchmarks and dataset sources that exist. (A per-effort or
        per-benchmark figure missing a key is the estimate's error, not the run's: an estimate
        never stops a run.)"""
        est, problems = self.cost.estimate, []
        where = "cost.estimate"
        for name in est.benchmark_sizes:
            if name not in self.benchmarks:
                problems.append(
                    f"{where}.benchmark_sizes.{name}: not a key of benchmarks "
                    "(the splits' sizes are heldout.size and heldout.dev_size)"
                )
        datasets = [s.name for s in self.sources if s.kind == "dataset"]
        for name in est.source_rows:
            if name not in datasets:
                problems.append(
                    f"{where}.source_rows.{name}: not a dataset source "
                    f"({', '.join(datasets) or 'there are none'})"
                )
        return problems

    def file_problems(self, root: Path) -> list[str]:
        """Paths the config names that must exist before any job runs (relative to ``root``)."""
        problems = []

        def check(key: str, path: str, want_dir: bool = False) -> None:
            full = Path(path) if Path(path).is_absolute() else root / path
            if not full.exists():
                problems.append(f"{key}: {path} does not exist (relative paths start at {root})")
            elif want_dir != full.is_dir():
                problems.append(f"{key}: {path} is {'not ' if want_dir else ''}a directory")

        for name, bench in self.benchmarks.items():
            if isinstance(bench, str):
                check(f"benchmarks.{name}", bench)
            elif bench.local:
                check(f"benchmarks.{name}.path", bench.path)
        for i, s in enumerate(self.sources):
            if (
                s.kind == "jsonl"
                or (s.kind == "dataset" and s.local)
                or (isinstance(s, KernelSource) and s.path)
            ):
                check(f"sources.{i}.path", s.path)
            elif isinstance(s, KernelSource) and s.dir:
                check(f"sources.{i}.dir", s.dir, want_dir=True)
        if self.train.chat_template:
            check("train.chat_template", self.train.chat_template)
        return problems + self._local_problems(root)

    def _local_problems(self, root: Path) -> list[str]:
        """What else the config names on this machine: models, ledgers, the workflow's rules, the
        results directory's name (kernel problems and what a model build checks: plan/checks.py)."""
        problems = []
        # results/<experiment> is one directory entry
        name_max = os.pathconf(root, "PC_NAME_MAX")
        if len(self.experiment.encode()) > name_max:
            problems.append(
                f"experiment: {len(self.experiment.encode())} bytes is longer than a file name "
                f"may be ({name_max} on {root})"
            )
        models = {"student.pretrained": self.student.pretrained}
        for name, t in self.teachers.items():
            if t.backend == "hf":
                models[f"teachers.{name}.model_path"] = t.model_path
            ledger = getattr(t, "budget", None) and t.budget.ledger
            if ledger and (Path(ledger) if Path(ledger).is_absolute() else root / ledger).is_dir():
                problems.append(f"teachers.{name}.budget.ledger: {ledger} is a directory")
        for key, model in models.items():
            problem = model and student_model.model_dir_problem(key, model, root)
            if problem:
                problems.append(problem)
        for key, spec in self._dataset_specs():
            path = Path(spec.path) if Path(spec.path).is_absolute() else root / spec.path
            if not spec.local and path.exists():
                problems.append(
                    f"{key}.path: {spec.path} is a local file of an unknown kind: local data is "
                    f"{', '.join(LOCAL_DATA)}"
                )
        if not any(p.startswith("student.pretrained") for p in problems):
            problems += student_model.problems(self, root)
        return problems

    def _dataset_specs(self) -> list[tuple[str, DatasetSpec]]:
        benchmarks = [
            (f"benchmarks.{n}", b) for n, b in self.benchmarks.items() if not isinstance(b, str)
        ]
        return benchmarks + [
            (f"sources.{i}", s) for i, s in enumerate(self.sources) if isinstance(s, DatasetSpec)
        ]
