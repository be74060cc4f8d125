# Shared by every stage: the config (loaded, checked and resolved once, before any job), paths,
# wildcard constraints, resources that follow the config, and how a rule calls its stage.
# Nothing is written and no environment variable set while the workflow is parsed (so neither under
# -n nor --lint): `onstart` does both when a run starts.
import functools
import json
import os
import re
import shutil
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.settings.types import DeploymentMethod

import stillroom.config
import stillroom.io
import stillroom.provenance
import stillroom.runtime.templates
from stillroom.cluster import backend_gpus, stage_gpus, train_resources
from stillroom.kernels.problemset import kernel_files, solution_files

REPO = Path(workflow.basedir)

# The config files given (each read again to refuse duplicated keys), or the embedded default; every
# default filled in, so each rule passes its sections through as they are.
try:
    RESOLVED = stillroom.config.workflow_config(
        config,
        workflow.config_settings.configfiles,
        default=REPO / "config" / "config.yaml",
        root=REPO,
    )
except (stillroom.config.ConfigError, stillroom.io.DataError) as exc:
    raise WorkflowError(str(exc)) from None
config.clear()
config.update(RESOLVED)

# A student whose chat template cannot mark its assistant turns fails here, not after generation
# (once, by the main process: a cluster job parses the workflow again).
TEMPLATE_PROBLEM = workflow.is_main_process and stillroom.runtime.templates.config_problem(
    config["student"]["pretrained"], config["train"]["chat_template"], REPO
)
if TEMPLATE_PROBLEM:
    raise WorkflowError(f"invalid config: {TEMPLATE_PROBLEM}")

CONDA = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
if shutil.which("stillroom") is None and not CONDA:
    raise WorkflowError(
        "`stillroom` is not on PATH: run `make run`, or `source .venv/bin/activate` first"
    )


def unset_profile_variables():
    """Environment variables the profile's resources name but the environment lacks: Snakemake keeps
    an unset `$NAME` literally, and sbatch would get it as the partition or account."""
    rs = workflow.resource_settings
    per_rule = (rs.overwrite_resources or {}).values()
    resources = [
        *dict(rs.default_resources or {}).values(),
        *(r for rule in per_rule for r in dict(rule).values()),
    ]
    names = {n for r in resources if isinstance(r.raw, str) for n in re.findall(r"\$\{?(\w+)", r.raw)}
    return sorted(n for n in names if n not in os.environ)


UNSET = unset_profile_variables() if workflow.is_main_process else []  # jobs: a pruned environment
if UNSET:
    raise WorkflowError(
        f"the profile's resources need {', '.join(UNSET)} in the environment "
        "(see profiles/slurm/profile.yaml; SLURM_ACCOUNT may be empty)"
    )


def partition_for(gpus):
    """SLURM partition of a rule whose GPU count follows the config (an API teacher needs none, a
    compiled-kernel grader one): the profile cannot see the config, and a --set-resources on the
    command line replaces the profile's whole set-resources (measured), so the rule declares it.
    Empty when not set (local runs); under the slurm profile the variable check above has run."""
    return os.environ.get("STILLROOM_GPU_PARTITION" if gpus else "STILLROOM_CPU_PARTITION", "")


def conda_env(backend):
    """The environment a rule's job runs in under --sdm conda: SGLang's own, for the rules that start
    an SGLang server, else the project's."""
    return f"../envs/{'sglang' if backend == 'sglang' else 'stillroom'}.yaml"


ENV = conda_env(None)
EXP = config["experiment"]
R = f"results/{EXP}"
TEACHER = config["generation"]["teacher"]
TEACHER_SPEC = config["teachers"][TEACHER]
EFFORTS = config["generation"]["efforts"]
GROUPED = {e for g in config["generation"]["effort_groups"] for e in g}
SHARDS = [f"{i:05d}" for i in range(config["generation"]["shards"])]
RATIOS = [str(r) for r in config["merge"]["ratios"]]
GRPO = config["grpo"] is not None  # kernel track: GRPO from the fine-tune (rules/grpo.smk)
MODELS = stillroom.config.Experiment.parse(config).models  # base, sft, grpo?, merge-<ratio>...
SELECT_ON = config["merge"]["select_on"]  # the dev split the merge ratio is chosen on, if any
WEIGHT_HOOKS = config["student"]["weight_hooks"]

# Provenance: every job records the hash of the resolved config and the git state of the workflow.
# The config's snapshot (named by its hash, so writing it never dirties anything) is written when
# the run starts, and the run's jobs find it and the workflow in their environment: on the jobs'
# command lines they would change every rule's command with any change of the config (or a move of
# the checkout), and Snakemake would rerun every job.
CONFIG_SHA256 = stillroom.config.config_hash(config)
CONFIG_SNAPSHOT = f"{R}/config/{CONFIG_SHA256[:16]}.json"


onstart:
    if not Path(CONFIG_SNAPSHOT).exists():
        stillroom.io.write_json(CONFIG_SNAPSHOT, config)
    os.environ.update(
        {
            stillroom.provenance.CONFIG_ENV: str(Path(CONFIG_SNAPSHOT).resolve()),
            stillroom.provenance.WORKFLOW_ENV: str(REPO),
        }
    )


wildcard_constraints:
    effort="|".join(EFFORTS),
    teacher=r"[^/]+",
    shard=r"\d{5}",
    model="base|sft|grpo|merge-[0-9.]+",
    ratio=r"[0-9.]+",
    bench=r"[^/]+",
    budget=r"\d+",
    run=r"[^/]+/[^/]+(/budget-\d+|/effort-[^/]+)?",


def repo_path(path):
    """Config paths are relative to the repository root."""
    return str(path if Path(path).is_absolute() else REPO / path)


# A benchmark is a JSONL file, or a dataset spec (hub id or file) that rule `benchmark` materialises.
BENCHMARKS = {
    name: (f"{R}/benchmarks/{name}.jsonl" if isinstance(b, dict) else repo_path(b))
    for name, b in config["benchmarks"].items()
}
LOCAL_DATA = tuple(stillroom.config.LOCAL_DATA)


def local_path(spec):
    """A source or benchmark spec with its local file (or problem directory) resolved against the
    repository root."""
    if str(spec.get("path", "")).endswith(LOCAL_DATA):
        return {**spec, "path": repo_path(spec["path"])}
    if spec.get("dir"):
        return {**spec, "dir": repo_path(spec["dir"])}
    return spec


SOURCES = [local_path(s) for s in config["sources"]]
KERNEL_SOURCES = [s for s in SOURCES if s["kind"] == "kernels"]
# Kernel problem files are pool inputs: editing one rebuilds everything downstream of it. The
# procedural teacher answers with the reference solutions: they are its generation jobs' inputs.
try:
    KERNEL_FILES = [str(f) for s in KERNEL_SOURCES for f in kernel_files(s).values()]
    TEACHER_FILES = [
        str(f) for s in KERNEL_SOURCES for f in solution_files(s).values()
    ] if TEACHER_SPEC["backend"] == "procedural" else []
except stillroom.io.DataError as exc:
    raise WorkflowError(f"sources: {exc}") from None

SPLITS = {"heldout": f"{R}/pool/heldout.jsonl", "dev": f"{R}/pool/dev.jsonl"}  # carved from the pool


def shards_of(effort):
    """Efforts listed in generation.effort_shards run on that many shards (a hash-random subset of
    prompts); the others on all of them."""
    return SHARDS[: config["generation"]["effort_shards"].get(effort, len(SHARDS))]


def tracked(**outputs):
    """Each artifact plus its provenance sidecar (`<name>_prov`), both declared so that a failed job
    removes both."""
    declared = {}
    for name, path in outputs.items():
        declared[name] = path
        declared[f"{name}_prov"] = f"{Path(path)}.prov.json"
    return declared


def as_json(**values):
    """Params for one rule: only what that stage depends on, so only real changes rerun it."""
    return json.dumps({"seed": config["seed"], **values}, sort_keys=True)


def named(mapping):
    return [f"{name}={path}" for name, path in mapping.items()]


def stillroom_cli(stage, rule, args):
    """A rule's shell command: its stage through the CLI, told its rule, params and threads;
    everything the stage prints goes to the rule's log."""
    return (
        f"stillroom {stage} {args} --rule {rule} --threads {{threads}}"
        " --params {params.p:q} >> {log:q} 2>&1"
    )


def timing(rule, wildcards=""):
    """A rule's benchmark file (wall time, memory, I/O of each job)."""
    suffix = f"-{wildcards}" if wildcards else ""
    return f"{R}/timing/{rule}{suffix}.tsv"


def benchmark_file(wildcards):
    """The problems of an evaluation benchmark: a split of the pool, or a configured benchmark file."""
    return SPLITS.get(wildcards.bench) or BENCHMARKS[wildcards.bench]


# Kernel answers are graded by the validator with the options of the kernels: section.
KERNELS = config["kernels"]
VALIDATOR = stillroom.config.Kernels.parse(KERNELS).validator.dump() if KERNELS else {}
KERNEL_BENCHMARKS = (KERNELS["benchmarks"] or config["eval"]["benchmarks"]) if KERNELS else []
# Compiled kernels (and their timed speedups) need a GPU to grade on.
KERNEL_GRADE_GPUS = stage_gpus(config).get("grade_eval", 0)

FORCE = config["eval"]["budget_force"] or {}
BUDGETS = FORCE.get("budgets", [])
BUDGET_MODELS = FORCE.get("models") or MODELS
BUDGET_BENCHMARKS = FORCE.get("benchmarks") or config["eval"]["benchmarks"]

PER_EFFORT = config["eval"]["per_effort"] or {}
EFFORT_MODELS = PER_EFFORT.get("models", [])
EFFORT_BENCHMARKS = (PER_EFFORT["benchmarks"] or config["eval"]["benchmarks"]) if PER_EFFORT else []


def all_tables():
    tables = [f"{R}/tables/{b}.md" for b in config["eval"]["benchmarks"]]
    tables += [f"{R}/tables/{b}-budgets.md" for b in BUDGET_BENCHMARKS if BUDGETS]
    tables += [f"{R}/tables/{b}-efforts.md" for b in EFFORT_BENCHMARKS]
    tables += [f"{R}/tables/{b}-kernels.md" for b in KERNEL_BENCHMARKS]
    return tables + [f"{R}/cost/ledger.md"]


# Per-stage helpers (lint: rule files hold rules only).


def generation_params(wildcards, efforts=None):
    effort = {"efforts": efforts} if efforts else {"effort": wildcards.effort}
    return as_json(
        teacher=wildcards.teacher,
        spec=config["teachers"][wildcards.teacher],
        samples=config["generation"]["samples_per_prompt"],
        **effort,
    )


def teacher_gpus(wildcards):
    """GPUs of the teacher's server inside the job (0 for an API)."""
    return backend_gpus(config["teachers"][wildcards.teacher])


def graded_shards():
    return {
        f"{e}-{s}": f"{R}/graded/{TEACHER}/{e}/shard-{s}.jsonl" for e in EFFORTS for s in shards_of(e)
    }


# What evaluation depends on: the eval section without the benchmark list and budget forcing (and
# no **kwargs: Snakemake would pass input, output, threads and resources into them, and a resource
# change, e.g. another profile, would rerun every evaluation).
DECODING = {k: config["eval"][k] for k in stillroom.config.Decoding.model_fields}


def eval_params(wildcards):
    return as_json(
        model_name=wildcards.model,
        benchmark=wildcards.bench,
        effort_tag=config["student"]["effort_tag"],
        **DECODING,
    )


def budget_params(wildcards):
    forcing = {k: FORCE[k] for k in stillroom.config.Forcing.model_fields}
    return as_json(
        model_name=wildcards.model,
        benchmark=wildcards.bench,
        effort_tag=config["student"]["effort_tag"],
        budget=int(wildcards.budget),
        **DECODING,
        **forcing,
    )


def effort_params(wildcards):
    return as_json(
        model_name=wildcards.model,
        benchmark=wildcards.bench,
        effort_tag=config["student"]["effort_tag"],
        **{**DECODING, "effort": wildcards.effort},
    )


def effort_graded(wildcards):
    return {
        f"{m}@{e}": f"{R}/eval/{m}/{wildcards.bench}/effort-{e}/graded.jsonl"
        for m in EFFORT_MODELS
        for e in EFFORTS
    }


def effort_tables_params(wildcards):
    return as_json(
        benchmark=wildcards.bench,
        efforts=EFFORTS,
        reference=PER_EFFORT["reference"],
        **config["tables"],
    )


def graded_models(wildcards):
    return {m: f"{R}/eval/{m}/{wildcards.bench}/graded.jsonl" for m in MODELS}


def tables_params(wildcards, fast_p=None):
    """(No **kwargs: Snakemake would pass input, output, threads and resources into them.)"""
    fast = {"fast_p": fast_p} if fast_p is not None else {}
    return as_json(benchmark=wildcards.bench, base="base", tuned="sft", **config["tables"], **fast)


def budget_graded(wildcards):
    return {
        f"{m}@{b}": f"{R}/eval/{m}/{wildcards.bench}/budget-{b}/graded.jsonl"
        for m in BUDGET_MODELS
        for b in BUDGETS
    }


def cost_artifacts():
    gen = {
        f"gen-{e}-{s}": f"{R}/gen/{TEACHER}/{e}/shard-{s}.jsonl" for e in EFFORTS for s in shards_of(e)
    }
    benches = config["eval"]["benchmarks"] + ([SELECT_ON] if SELECT_ON else [])
    evals = {
        f"eval-{m}-{b}": f"{R}/eval/{m}/{b}/samples.jsonl"
        for m in MODELS
        for b in benches
        if b in config["eval"]["benchmarks"] or m.startswith("merge-")
    }
    budgets = {
        f"budget-{m}-{b}-{B}": f"{R}/eval/{m}/{b}/budget-{B}/samples.jsonl"
        for m in BUDGET_MODELS
        for b in BUDGET_BENCHMARKS
        for B in BUDGETS
    }
    merges = {f"merge-{r}": f"{R}/ckpt/merge-{r}" for r in RATIOS}
    grpo = {"grpo": f"{R}/ckpt/grpo"} if GRPO else {}
    per_effort = {
        f"effort-{m}-{b}-{e}": f"{R}/eval/{m}/{b}/effort-{e}/samples.jsonl"
        for m in EFFORT_MODELS
        for b in EFFORT_BENCHMARKS
        for e in EFFORTS
    }
    train = {f"train{sfx}": f"{R}/ckpt/sft{sfx}" for sfx in STAGE_SUFFIX}  # every stage
    return {**gen, **train, **grpo, **merges, **evals, **budgets, **per_effort}


# GPUs per job follow the job shapes (stillroom/cluster.py); cost.gpus overrides them. The ledger
# sets the estimate made from the whole config (stillroom/estimate.py, run in the cost job, not
# here) beside what was spent; local files it counts are resolved against the repository.
COST_PARAMS = {
    **config["cost"],
    "gpus": {**stage_gpus(config), **config["cost"]["gpus"]},
    "config": {
        **config,
        "sources": SOURCES,
        "benchmarks": {
            name: local_path(b) if isinstance(b, dict) else repo_path(b)
            for name, b in config["benchmarks"].items()
        },
    },
}


# Training (rules/train.smk): the stages of train.stages, one job of rule train each.
TRAIN_TEMPLATE = config["train"]["chat_template"]
TRAIN_COMMON = {k: v for k, v in config["train"].items() if k != "stages"}
TRAIN_STAGES = config["train"]["stages"]
# the suffix of each stage's checkpoint ("" for the last, which is the fine-tune)
STAGE_SUFFIX = [f"-{s['name']}" for s in TRAIN_STAGES[:-1]] + [""]


def train_stage(wildcards):
    """This job's stage (None without train.stages) and the checkpoint it starts from."""
    if not TRAIN_STAGES:
        return None, f"{R}/ckpt/base"
    i = STAGE_SUFFIX.index(wildcards.stage)
    return TRAIN_STAGES[i], f"{R}/ckpt/sft{STAGE_SUFFIX[i - 1]}" if i else f"{R}/ckpt/base"


def train_params(wildcards):
    stage, _ = train_stage(wildcards)
    per_stage = {} if stage is None else {"epochs": stage["epochs"], "stage": stage}
    return as_json(**{**TRAIN_COMMON, **per_stage}, weight_hooks=WEIGHT_HOOKS)
