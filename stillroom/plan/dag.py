"""The workflow's plan: every rule's paths, input mappings and job shapes, computed once from the
typed experiment and its resolved config. rules/*.smk declare rules with these; rules/common.smk
keeps only what must be Snakemake (the config load, onstart, wildcard constraints, the provenance
wrappers).

A job's params are not the plan's: each stage builds its own from the typed experiment beside the
class that reads them (``*job_params`` in stillroom/stages/<stage>.py). Input mappings are
``{name: path}`` dicts, a job's ``--graded name=path ...`` arguments."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from ..config import LOCAL_DATA, Experiment
from ..config.data import local_spec, repo_path
from ..kernels.problemset import FAMILY_FILE, kernel_files, solution_files
from .cluster import CLIENT_MEM_MB, backend_gpus, stage_gpus, student_mem_mb, train_resources
from .estimate import student_parameters
from .generation import effort_key, effort_keys, server_of, teacher_servers
from .paths import EVAL_RUNS, PATHS, fill


def unset_profile_variables(
    resource_settings: Any, environ: Mapping[str, str] = os.environ
) -> list[str]:
    """Environment variables the profile's resources name (Snakemake's ``resource_settings``) but
    the environment lacks: Snakemake keeps an unset `$NAME` literally, and sbatch would get it as
    the partition or account."""
    rs = resource_settings
    per_rule = (rs.overwrite_resources or {}).values()
    resources = [
        *dict(rs.default_resources or {}).values(),
        *(r for rule in per_rule for r in dict(rule).values()),
    ]
    names = {
        n for r in resources if isinstance(r.raw, str) for n in re.findall(r"\$\{?(\w+)", r.raw)
    }
    return sorted(n for n in names if n not in environ)


def partition_for(gpus: int) -> str:
    """SLURM partition of a rule whose GPU count follows the config (an API teacher needs none, a
    compiled-kernel grader one): the profile cannot see the config, and a --set-resources on the
    command line replaces the profile's whole set-resources (measured), so the rule declares it.
    Empty when not set (local runs); under the slurm profile rules/common.smk has checked the
    profile's variables."""
    return os.environ.get("STILLROOM_GPU_PARTITION" if gpus else "STILLROOM_CPU_PARTITION", "")


def conda_env(backend: str | None) -> str:
    """The environment a rule's job runs in under --sdm conda: SGLang's own, for the rules that
    start an SGLang server, else the project's (relative to rules/)."""
    return f"../envs/{'sglang' if backend == 'sglang' else 'stillroom'}.yaml"


def model_source(name: str, root: Path) -> str:
    """A model directory of the repository, made absolute (a job may run in another working
    directory); a hub id as it is, fetched by its job."""
    path = Path(name)
    if path.is_absolute():
        return name
    return str(root / name) if (root / name).is_dir() else name


def one_of(names: Iterable[str]) -> str:
    """A wildcard constraint matching exactly ``names`` (none: a pattern that matches nothing)."""
    return "|".join(re.escape(n) for n in names) or "(?!)"


def phase_names(phases: list[dict[str, Any]]) -> dict[str, str]:
    """Each training phase's checkpoint suffix, the {phase} wildcard of ckpt/sft{phase} ("-<name>";
    "" for the last, the fine-tune), to the phase's name ("" without train.phases: one job)."""
    names = [ph["name"] for ph in phases]
    return {f"-{name}": name for name in names[:-1]} | {"": names[-1] if names else ""}


class Plan:
    """Paths and params of one experiment's rules. ``config`` is the resolved config (every default
    filled in) that ``experiment`` was parsed from; ``root`` the repository, against which config
    paths are resolved."""

    def __init__(self, experiment: Experiment, config: Mapping[str, Any], root: Path) -> None:
        self.experiment = experiment
        self.config = config
        self.root = Path(root)
        self.results = f"results/{experiment.experiment}"
        generation = experiment.generation
        self.generation = generation
        self.efforts = list(generation.efforts)
        self.effort_teacher = {e: generation.teacher_of(e) for e in self.efforts}
        self.shards = [f"{i:05d}" for i in range(config["generation"]["shards"])]
        self.model_ids = experiment.model_ids  # in table order
        self.models = [m.name for m in self.model_ids]
        self.merges = {m.name: m for m in self.model_ids if m.kind == "merge"}
        self.ablation = list(experiment.dataset.ablation)
        self.select_on = config["merge"]["select_on"]
        self.grpo = config["grpo"] is not None
        force = config["eval"]["budget_force"] or {}
        self.budgets = force.get("budgets", [])
        self.budget_models = force.get("models") or self.models
        self.budget_benchmarks = force.get("benchmarks") or config["eval"]["benchmarks"]
        per_effort = config["eval"]["per_effort"] or {}
        self.effort_models = per_effort.get("models", [])
        self.effort_benchmarks = (
            (per_effort["benchmarks"] or config["eval"]["benchmarks"]) if per_effort else []
        )
        kernels = config["kernels"]
        self.kernel_benchmarks = (
            (kernels["benchmarks"] or config["eval"]["benchmarks"]) if kernels else []
        )
        # compiled kernels (and their timed speedups) need a GPU to grade on
        self.kernel_grade_gpus = stage_gpus(config).get("grade_eval", 0)
        train = config["train"]
        self.train_template = train["chat_template"]
        self.train_phases = train["phases"]
        self.phase_name = phase_names(self.train_phases)  # the {phase} wildcard to its name
        self.phase_suffix = list(self.phase_name)
        # LoRA / QLoRA: each training job saves its adapter (ckpt/<name>.adapter), which rule
        # merge_adapter streams into the checkpoint that job started from, as ckpt/<name>
        self.adapter = train["method"] != "full"
        self.trained_as = ".adapter" if self.adapter else ""
        self.trained = [f"sft{sfx}" for sfx in self.phase_suffix] + [
            f"select-{s}" for s in self.ablation
        ]

    # -- paths -------------------------------------------------------------------------------

    def path(self, name: str, **fields: object) -> str:
        """Artifact ``name`` of this experiment (stillroom/plan/paths.py PATHS), ``fields`` filled
        in; the others stay wildcards."""
        return f"{self.results}/{fill(PATHS[name], **fields)}"

    def eval_path(self, name: str, rule: str, **fields: object) -> str:
        """The samples or graded file (``name``) of an evaluation job of ``rule`` (EVAL_RUNS)."""
        return self.path(name, run=fill(EVAL_RUNS[rule], **fields))

    def checkpoint(self, name: str) -> str:
        """A model's checkpoint (``name``: base, sft<phase>, a merge, ...)."""
        return self.path("checkpoint", model=name)

    def log(self, job: str) -> str:
        """A job's log (``job`` may hold its rule's wildcards)."""
        return self.path("log", job=job)

    def repo_path(self, path: str | Path) -> str:
        return repo_path(path, self.root)

    def local_path(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        return local_spec(spec, self.root)

    @cached_property
    def benchmarks(self) -> dict[str, str]:
        """Each benchmark's JSONL file: as configured, or materialised by rule benchmark from a
        dataset spec."""
        return {
            name: (self.path("benchmark", bench=name) if isinstance(b, dict) else self.repo_path(b))
            for name, b in self.config["benchmarks"].items()
        }

    def timing(self, rule: str, wildcards: str = "") -> str:
        """A rule's timing file, Snakemake's benchmark: (wall time, memory, I/O of each job)."""
        suffix = f"-{wildcards}" if wildcards else ""
        return self.path("timing", job=f"{rule}{suffix}")

    @property
    def splits(self) -> dict[str, str]:
        """The splits carved from the pool."""
        return {s: self.path(s) for s in ("heldout", "dev")}

    @property
    def eval_splits(self) -> dict[str, str]:
        """Evaluated like benchmarks: the splits, and "train", the pool the models trained on
        (never a decontamination target: it is what decontamination leaves)."""
        return {**self.splits, "train": self.path("decontaminated")}

    def benchmark_file(self, bench: str) -> str:
        """The problems of an evaluation benchmark: a split of the pool, or a benchmark file."""
        return self.eval_splits.get(bench) or self.benchmarks[bench]

    def reported(self) -> dict[str, str]:
        """The reported benchmarks' problem files (the merge ratio's dev split must be disjoint)."""
        return {b: self.benchmark_file(b) for b in self.config["eval"]["benchmarks"]}

    @cached_property
    def sources(self) -> list[dict[str, Any]]:
        return [self.local_path(s) for s in self.config["sources"]]

    def source_files(self) -> list[str]:
        """The sources' local files, pool inputs."""
        return [
            s["path"] for s in self.sources if (s.get("path") or "").endswith(tuple(LOCAL_DATA))
        ]

    @cached_property
    def _kernel_files(self) -> tuple[list[str], list[str]]:
        # Kernel problem files are pool inputs: editing one rebuilds everything downstream of it.
        # The procedural teacher answers with the reference solutions: they are its generation
        # jobs' inputs. A generated family's problems and solutions both come from its generator.
        sources = [s for s in self.sources if s["kind"] == "kernels"]
        family = [str(FAMILY_FILE)] if any(s.get("family") for s in sources) else []
        problems = [str(f) for s in sources for f in kernel_files(s).values()] + family
        solutions = [str(f) for s in sources for f in solution_files(s).values()] + family
        return problems, solutions

    @property
    def kernel_files(self) -> list[str]:
        return self._kernel_files[0]

    @property
    def solution_files(self) -> list[str]:
        return self._kernel_files[1]

    def teacher_files(self, teacher: str) -> list[str]:
        """Files a teacher's generation jobs read besides their shard."""
        procedural = self.config["teachers"][teacher]["backend"] == "procedural"
        return self.solution_files if procedural else []

    def shard_paths(self) -> list[str]:
        return [self.path("shard", shard=s) for s in self.shards]

    def shards_of(self, effort: str) -> list[str]:
        """Efforts listed in generation.effort_shards run on that many shards (a hash-random subset
        of prompts); the others on all of them."""
        return self.shards[
            : self.config["generation"]["effort_shards"].get(effort, len(self.shards))
        ]

    def graded_shards(self) -> dict[str, str]:
        """Every effort's graded shards, each from the teacher of its effort."""
        return {
            f"{e}-{s}": self.path("graded_shard", teacher=self.effort_teacher[e], effort=e, shard=s)
            for e in self.efforts
            for s in self.shards_of(e)
        }

    @property
    def teachers_md(self) -> str:
        """The teachers' trace lengths compared, when efforts go to different teachers."""
        return self.path("teacher_tables", ext="md")

    def graded_models(self, bench: str) -> dict[str, str]:
        return {m: self.eval_path("graded", "evaluate", model=m, bench=bench) for m in self.models}

    def budget_graded(self, bench: str) -> dict[str, str]:
        return {
            f"{m}@{b}": self.eval_path("graded", "evaluate_budget", model=m, bench=bench, budget=b)
            for m in self.budget_models
            for b in self.budgets
        }

    def effort_graded(self, bench: str) -> dict[str, str]:
        return {
            f"{m}@{e}": self.eval_path("graded", "evaluate_effort", model=m, bench=bench, effort=e)
            for m in self.effort_models
            for e in self.efforts
        }

    def dev_graded(self) -> dict[str, str]:
        """Each merge's graded samples on the dev split its ratio is chosen on."""
        return {
            m: self.eval_path("graded", "evaluate", model=m, bench=self.select_on)
            for m in self.merges
        }

    @property
    def merge_choice(self) -> list[str]:
        """The merge chosen on dev, if any (the tables mark it)."""
        return [self.path("merge_choice")] if self.select_on else []

    def table_benchmarks(self) -> dict[str, list[str] | None]:
        """The rules whose outputs no job reads, each with its benchmarks (a job each; None: one
        job): rule all asks for their files, sidecars too, since Snakemake checks only the outputs
        something asks for, so one deleted would never be written again. A table rule's {bench}
        is constrained to its benchmarks here (rules/tables.smk): all tables share tables/."""
        benchmarks = self.config["eval"]["benchmarks"]
        tables: dict[str, list[str] | None] = {
            "tables": benchmarks,
            "budget_tables": self.budget_benchmarks if self.budgets else [],
            "effort_tables": self.effort_benchmarks,
            "kernel_tables": self.kernel_benchmarks,
        }
        if self.generation.mixed:
            tables["teacher_tables"] = None
        return tables | {"cost": None, "decontam": None}

    def evaluations(self) -> dict[str, str]:
        """Every evaluation job's run (the {run} of its samples and graded files), by its name in
        the cost ledger."""
        reported = self.config["eval"]["benchmarks"]
        benches = reported + ([self.select_on] if self.select_on else [])
        runs = {
            f"eval-{m}-{b}": fill(EVAL_RUNS["evaluate"], model=m, bench=b)
            for m in self.models
            for b in benches
            if b in reported or m in self.merges
        }
        runs |= {
            f"budget-{m}-{b}-{B}": fill(EVAL_RUNS["evaluate_budget"], model=m, bench=b, budget=B)
            for m in self.budget_models
            for b in self.budget_benchmarks
            for B in self.budgets
        }
        return runs | {
            f"effort-{m}-{b}-{e}": fill(EVAL_RUNS["evaluate_effort"], model=m, bench=b, effort=e)
            for m in self.effort_models
            for b in self.effort_benchmarks
            for e in self.efforts
        }

    def services(self) -> list[str]:
        """The service file of every server a full run starts (rules/serve.smk), one start each:
        each served teacher's servers, then each checkpoint with an evaluation job when
        evaluation is served. A rerun starts only those with a stale client."""
        teachers = [
            self.path("teacher_service", teacher=t, server=server)
            for t in self.generation.used_teachers
            if self.teacher_served(t)
            for server in teacher_servers(self.generation, t)
        ]
        models = {run.split("/")[0]: None for run in self.evaluations().values()}
        served = [self.path("model_service", model=m) for m in models] if self.eval_served else []
        return teachers + served

    def cost_artifacts(self) -> dict[str, str]:
        """What the cost ledger charges for: generation shards, every checkpoint, every
        evaluation's samples."""
        # a group's efforts name its one file each (the ledger counts its job once)
        gen = {
            f"gen-{e}-{s}": self.generated(e, shard=s)
            for e in self.efforts
            for s in self.shards_of(e)
        }
        ckpt = self.checkpoint
        # every training phase (LoRA / QLoRA: its adapter, and the CPU job that merged it)
        train = {f"train{sfx}": ckpt(f"sft{sfx}{self.trained_as}") for sfx in self.phase_suffix}
        train |= {f"train-select-{s}": ckpt(f"select-{s}{self.trained_as}") for s in self.ablation}
        train |= {f"merge_adapter-{n}": ckpt(n) for n in self.trained if self.adapter}
        grpo = {"grpo": ckpt("grpo")} if self.grpo else {}
        merges = {m: ckpt(m) for m in self.merges}
        evals = {k: self.path("samples", run=run) for k, run in self.evaluations().items()}
        return {**gen, **train, **grpo, **merges, **evals}

    def sidecars(self, paths: str | Iterable[str]) -> list[str]:
        """The provenance sidecars of the workflow's own artifacts (everything under
        results/<experiment>) among ``paths``; a user's source, benchmark or template file has
        none."""
        paths = [paths] if isinstance(paths, str) else list(paths)
        return [f"{Path(p)}.prov.json" for p in paths if str(p).startswith(f"{self.results}/")]

    def all_sidecars(self) -> list[str]:
        """The sidecar of every artifact the config's DAG writes. Snakemake looks for a missing
        output of a job only when something asks for it and is about to run, so a deleted
        intermediate sidecar would be found only when a job reading its artifact runs anyway; as
        targets, a deleted one reruns its job (and what reads the artifact). Artifacts stay as they
        were: a checkpoint deleted to save space, its sidecar kept, is not rebuilt."""
        artifacts = [
            *self.benchmarks.values(),
            self.path("pool"),
            *self.eval_splits.values(),
            *self.shard_paths(),
            *self.graded_shards().values(),
            self.path("dataset"),
            *(self.path("ablation_dataset", selection=s) for s in self.ablation),
            *([] if self.pretrained else [self.path("tokenizer")]),
            self.checkpoint("base"),
            *self.cost_artifacts().values(),
            *(self.path("graded", run=run) for run in self.evaluations().values()),
            *self.merge_choice,
        ]
        # an effort group's generation file is the cost artifact of each of its efforts
        return self.sidecars(dict.fromkeys(artifacts))

    # -- jobs --------------------------------------------------------------------------------

    @property
    def pretrained(self) -> str | None:
        """The student's pretrained model (path or hub id), or None: built from scratch."""
        return self.config["student"]["pretrained"]

    def teacher_backend(self, teacher: str) -> str:
        return self.config["teachers"][teacher]["backend"]

    def teacher_gpus(self, teacher: str) -> int:
        """GPUs of the teacher's server inside the job (0 for an API)."""
        return backend_gpus(self.config["teachers"][teacher])

    def teacher_served(self, teacher: str) -> bool:
        """The teacher is a server its generation jobs share (sglang): started once per server
        allocation (rules/serve.smk), not in each job."""
        return self.teacher_backend(teacher) == "sglang"

    def teacher_service(self, teacher: str, shard: str) -> list[str]:
        """A generation job's `server` input: its teacher's server for this shard, if served
        (none: the job's shell line passes `--server=`, which the stage takes as absent)."""
        if not self.teacher_served(teacher):
            return []
        return [
            self.path("teacher_service", teacher=teacher, server=server_of(self.generation, shard))
        ]

    def served_inputs(self, stage: str) -> list[str]:
        """The optional inputs of ``stage``'s shell lines: `server` where some of its jobs are
        clients of a shared server (the others pass `--server=`); none, and the lines are as
        before, where none is."""
        if stage == "generate":
            served = any(self.teacher_served(t) for t in self.generation.used_teachers)
        else:
            served = self.eval_served
        return ["server"] if served else []

    @property
    def eval_served(self) -> bool:
        """Each evaluated checkpoint is a server its evaluation jobs share (eval.backend sglang)."""
        return self.eval_backend == "sglang"

    def model_service(self, model: str) -> list[str]:
        """An evaluation job's `server` input: its checkpoint's server, if served (as
        teacher_service)."""
        return [self.path("model_service", model=model)] if self.eval_served else []

    @property
    def eval_backend(self) -> str:
        return self.config["eval"]["backend"]["backend"]

    @property
    def eval_gpus(self) -> int:
        """GPUs of an evaluation job: its server's, one for an in-process model, none for an API."""
        return backend_gpus(self.config["eval"]["backend"])

    @property
    def grpo_resources(self) -> dict[str, Any]:
        """Nodes and GPUs of the GRPO job, from grpo.distributed."""
        return train_resources(self.config, "grpo")

    @property
    def ablation_resources(self) -> dict[str, Any]:
        """Nodes and GPUs of a dataset ablation's training job, from train.distributed."""
        return train_resources(self.config)

    @cached_property
    def student_parameters(self) -> float | None:
        return student_parameters(self.experiment, self.root)

    def student_mem_mb(self, rule: str):
        """mem_mb of ``rule``'s jobs, which hold the student: a resource function of the attempt
        that follows the student's size (stillroom/plan/cluster.py student_mem_mb)."""
        return lambda wildcards, attempt: student_mem_mb(rule, self.student_parameters, attempt)

    def eval_resources(self, rule: str) -> dict[str, Any]:
        """GPUs, nodes and mem_mb of an evaluation rule's jobs: the student's share, or, when its
        server is shared (eval_served), a client's, which holds none of them (rules/serve.smk)."""
        if self.eval_served:
            return {
                "gpu": 0,
                "nodes": 0,
                "mem_mb": lambda wildcards, attempt: CLIENT_MEM_MB * attempt,
            }
        return {"gpu": self.eval_gpus, "nodes": 1, "mem_mb": self.student_mem_mb(rule)}

    @property
    def chat_template(self) -> dict[str, str]:
        """Training's chat template file as a job input, if train.chat_template is set."""
        template = self.train_template
        return {"chat_template": self.repo_path(template)} if template else {}

    @property
    def phase_constraint(self) -> str:
        """The {phase} wildcard of ckpt/sft{phase}: a phase's suffix ("(?:)": ckpt/sft itself)."""
        return "|".join(f"(?:{re.escape(s)})" for s in self.phase_suffix)

    # -- training ------------------------------------------------------------------------------

    def train_phase(self, suffix: str) -> tuple[dict[str, Any] | None, str]:
        """The train.phases entry of the job writing ckpt/sft<suffix> (None without train.phases)
        and the checkpoint it starts from."""
        base = self.checkpoint("base")
        if not self.train_phases:
            return None, base
        i = self.phase_suffix.index(suffix)
        return self.train_phases[i], self.checkpoint(
            f"sft{self.phase_suffix[i - 1]}"
        ) if i else base

    def adapter_base(self, trained: str) -> str:
        """The checkpoint the training job of ckpt/<trained> (one of ``trained``) started from."""
        starts = {f"sft{sfx}": self.train_phase(sfx)[1] for sfx in self.phase_suffix}
        starts |= {f"select-{s}": self.checkpoint("base") for s in self.ablation}
        return starts[trained]

    @cached_property
    def _train_shapes(self) -> list[dict[str, Any]]:
        # nodes and GPUs of each phase's job, which may have a layout of its own
        shapes = [train_resources(self.config, phase=i) for i in range(len(self.train_phases))]
        return shapes or [train_resources(self.config)]

    def train_resource(self, key: str, suffix: str) -> Any:
        """Resource ``key`` of the job writing ckpt/sft<suffix>: None where its shape lacks it,
        which Snakemake leaves unset."""
        return self._train_shapes[self.phase_suffix.index(suffix)].get(key)

    def train_resource_keys(self) -> list[str]:
        return list(dict.fromkeys(k for shape in self._train_shapes for k in shape))

    # -- generation jobs -------------------------------------------------------------------

    @cached_property
    def effort_keys(self) -> dict[str, list[str]]:
        """Each generation job's effort key, its {efforts} wildcard -> the efforts it generates."""
        return effort_keys(self.generation)

    def generated(self, effort: str, teacher: str | None = None, shard: str = "{shard}") -> str:
        """The generation file holding ``effort``'s samples (its group's file, if it is grouped)."""
        return self.path(
            "generated",
            teacher=teacher or self.effort_teacher[effort],
            efforts=effort_key(self.generation, effort),
            shard=shard,
        )

    def grouped(self, effort: str) -> bool:
        """``effort`` is generated in one file with the other efforts of its group."""
        return effort_key(self.generation, effort) != effort

    def job_efforts(self, teacher: str, key: str) -> str | list[str]:
        """The efforts of the generation job of ``teacher`` at effort key ``key``: one effort, or
        its group's (a list: one job for all, in order)."""
        efforts = self.effort_keys[key]
        owner = self.effort_teacher[efforts[0]]
        if owner != teacher:
            raise ValueError(f"gen/{teacher}/{key}: {key} is generated by teacher '{owner}'")
        return efforts if len(efforts) > 1 else efforts[0]

    @property
    def generation_constraints(self) -> dict[str, str]:
        return {
            "teacher": one_of(self.generation.used_teachers),
            "efforts": one_of(self.effort_keys),
        }


def named(mapping: Mapping[str, str]) -> list[str]:
    """An input mapping as a job's ``name=path`` arguments."""
    return [f"{name}={path}" for name, path in mapping.items()]
