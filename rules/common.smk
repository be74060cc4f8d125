# Shared by every stage: config validation, path helpers, wildcard constraints, params as JSON.
import functools
import json
import os
import re
import shutil
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

import stillroom.config
import stillroom.sources
from stillroom.kernels import SOLUTIONS_DIR, VALIDATOR_DEFAULTS
from stillroom.cluster import backend_gpus, stage_gpus, train_resources

try:
    validate(config, schema="../config/schema.yaml")
except WorkflowError:
    stillroom.config.validate(config)  # the same schema, re-checked to name every bad key
    raise
stillroom.config.cross_check(config)  # references between sections, which a schema cannot express

if shutil.which("stillroom") is None:
    raise WorkflowError("`stillroom` is not on PATH: run `make run`, or `source .venv/bin/activate` first")


def unset_profile_variables():
    """Environment variables the profile's resources name but the environment lacks: Snakemake keeps an
    unset `$NAME` literally, and sbatch would get it as the partition or account (profiles/slurm)."""
    rs = workflow.resource_settings
    resources = [*dict(rs.default_resources or {}).values()]
    resources += [r for rule in (rs.overwrite_resources or {}).values() for r in dict(rule).values()]
    names = {n for r in resources if isinstance(r.raw, str) for n in re.findall(r"\$\{?(\w+)", r.raw)}
    return sorted(n for n in names if n not in os.environ)


UNSET = unset_profile_variables() if workflow.is_main_process else []  # jobs see a pruned environment
if UNSET:
    raise WorkflowError(f"the profile's resources need {', '.join(UNSET)} in the environment "
                        "(see profiles/slurm/profile.yaml; SLURM_ACCOUNT may be empty)")

def partition_for(gpus):
    """SLURM partition of a rule whose GPU count follows the config (an API teacher needs none, a compiled-
    kernel grader one): the profile cannot see the config, and a --set-resources on the command line
    replaces the profile's whole set-resources (measured), so the rule declares it. Empty when not set
    (local runs); under the slurm profile the variable check above has run."""
    return os.environ.get("STILLROOM_GPU_PARTITION" if gpus else "STILLROOM_CPU_PARTITION", "")


REPO = Path(workflow.basedir)
EXP = config["experiment"]
R = f"results/{EXP}"
TEACHER = config["generation"]["teacher"]
EFFORTS = config["generation"]["efforts"]
GROUPED = {e for g in config["generation"].get("effort_groups", []) for e in g}
SHARDS = [f"{i:05d}" for i in range(config["generation"]["shards"])]
RATIOS = [str(r) for r in config["merge"]["ratios"]]
GRPO = "grpo" in config  # kernel track: GRPO from the fine-tune (rules/train.smk)
MODELS = ["base", "sft"] + (["grpo"] if GRPO else []) + [f"merge-{r}" for r in RATIOS]
SELECT_ON = config["merge"].get("select_on")  # the dev benchmark the merge ratio is chosen on, if any
WEIGHT_HOOKS = config["student"].get("weight_hooks", [])

# Provenance: every job records the hash of the resolved config and where a snapshot of it is.
CONFIG_SHA256 = stillroom.config.config_hash(config)
CONFIG_SNAPSHOT = Path(R, "config", f"{CONFIG_SHA256[:16]}.json")
if not CONFIG_SNAPSHOT.exists():  # content-addressed, so writing it never dirties anything
    CONFIG_SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    CONFIG_SNAPSHOT.write_text(json.dumps(config, indent=2, sort_keys=True))
os.environ["STILLROOM_CONFIG_SHA256"] = CONFIG_SHA256
os.environ["STILLROOM_CONFIG_PATH"] = str(CONFIG_SNAPSHOT.resolve())
os.environ["STILLROOM_REPO"] = str(REPO)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


wildcard_constraints:
    effort="|".join(EFFORTS),
    teacher=r"[^/]+",
    shard=r"\d{5}",
    model="base|sft|grpo|merge-[0-9.]+",
    ratio=r"[0-9.]+",
    bench=r"[^/]+",
    budget=r"\d+",
    run=r"[^/]+/[^/]+(/budget-\d+)?",


def repo_path(path):
    """Config paths are relative to the repository root."""
    return str(path if Path(path).is_absolute() else REPO / path)


# A benchmark is a JSONL file, or a dataset spec (hub id or file) that rule `benchmark` materialises.
BENCHMARKS = {name: (f"{R}/benchmarks/{name}.jsonl" if isinstance(b, dict) else repo_path(b))
              for name, b in config["benchmarks"].items()}
LOCAL_DATA = (".jsonl", ".json", ".parquet", ".csv")


def local_path(spec):
    """A source or benchmark spec with its local file (or kernel problem dir) resolved against the repository root."""
    if isinstance(spec, dict) and str(spec.get("path", "")).endswith(LOCAL_DATA):
        return {**spec, "path": repo_path(spec["path"])}
    if isinstance(spec, dict) and spec.get("dir"):
        return {**spec, "dir": repo_path(spec["dir"])}
    return spec


SOURCES = [local_path(s) for s in config["sources"]]
# Kernel problem files are pool inputs: editing one rebuilds everything downstream of it. The procedural
# teacher answers with the reference solutions, so they are its generation jobs' inputs.
KERNEL_FILES = [str(f) for s in SOURCES if s["kind"] == "kernels" for f in stillroom.sources.kernel_files(s).values()]
TEACHER_FILES = [str(SOLUTIONS_DIR / f"{name}.py") for s in SOURCES if s["kind"] == "kernels" and not s.get("dir")
                 for name in stillroom.sources.kernel_files(s) if (SOLUTIONS_DIR / f"{name}.py").exists()
                 ] if config["teachers"][TEACHER]["backend"] == "procedural" else []


def shards_of(effort):
    """Efforts listed in generation.effort_shards run on that many shards (a hash-random subset of
    prompts); the others on all of them."""
    return SHARDS[: config["generation"].get("effort_shards", {}).get(effort, len(SHARDS))]


def tracked(**outputs):
    """Each artifact plus its provenance sidecar (`<name>_prov`), both declared so a failed job removes both."""
    declared = {}
    for name, path in outputs.items():
        declared[name] = path
        declared[f"{name}_prov"] = str(path).rstrip("/") + ".prov.json"
    return declared


def as_json(**values):
    """Params for one rule: only what that stage depends on, so only real changes rerun it."""
    return json.dumps({"seed": config["seed"], **values}, sort_keys=True)


def named(mapping):
    return [f"{name}={path}" for name, path in mapping.items()]


SPLITS = {"heldout": f"{R}/pool/heldout.jsonl", "dev": f"{R}/pool/dev.jsonl"}  # carved from the pool


def benchmark_file(wildcards):
    """The problems of an evaluation benchmark: a split of the pool, or a configured benchmark file."""
    return SPLITS.get(wildcards.bench) or BENCHMARKS[wildcards.bench]


# Kernel answers are graded by the validator with these options (stillroom.kernels.evaluate).
KERNELS = config.get("kernels")
KERNEL_GRADING = {"kernel": {k: v for k, v in KERNELS.items() if k in VALIDATOR_DEFAULTS}} if KERNELS else {}
KERNEL_BENCHMARKS = KERNELS.get("benchmarks", config["eval"]["benchmarks"]) if KERNELS else []
KERNEL_GRADE_GPUS = int(bool(KERNELS) and KERNELS.get("device") == "cuda")  # compiled kernels, timed speedups

BUDGETS = config["eval"].get("budget_force", {}).get("budgets", [])
BUDGET_MODELS = config["eval"].get("budget_force", {}).get("models", MODELS)
BUDGET_BENCHMARKS = config["eval"].get("budget_force", {}).get("benchmarks", config["eval"]["benchmarks"])


def all_tables():
    tables = [f"{R}/tables/{b}.md" for b in config["eval"]["benchmarks"]]
    tables += [f"{R}/tables/{b}-budgets.md" for b in BUDGET_BENCHMARKS if BUDGETS]
    tables += [f"{R}/tables/{b}-kernels.md" for b in KERNEL_BENCHMARKS]
    return tables + [f"{R}/cost/ledger.md"]


# Appended to every `stillroom <stage>` command: provenance, threads, progress log, params.
STAGE_ARGS = " --rule {rule} --threads {threads} --log {log} --params {params.p:q}"
