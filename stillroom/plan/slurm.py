"""What a run on profiles/slurm would submit, without a cluster: every job of a Snakemake dry run
with the profile, rendered to its sbatch command line by the SLURM executor plugin's own
submit-string code.

    stillroom plan --configfile config/experiments/beam-distill.yaml

(overlays: more files after it, as Snakemake takes them, or each after its own ``--configfile``)
prints one line per rule: job count and the sbatch options (partition, GPUs, nodes, tasks, CPUs,
memory, wall time); a rule whose jobs differ in shape (train.phases with layouts of their own)
one line per shape, named by its phase (``train[phase=medium]``). Check this before queueing a
recipe; tests/workflow/test_slurm_profile.py checks the recipes. Jobs of the profile's
``slurm-array-jobs`` rules go out as arrays (``--array=1-N``); the plugin submits those through its
array path, with the same per-task options.

Offline means no controller is asked: the plugin runs ``scontrol show config`` when it is imported
(for its help text and MaxArraySize), which waits 9-10 s per call where SLURM is installed but its
controller is down or unreachable. The dry run and the rendering run in one child process
(slurm_dry_run.py) that is given no SLURM configuration, so the probe fails at once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from ..workflow import REPO, snakemake_command, snakemake_env

PROFILE = REPO / "profiles" / "slurm" / "profile.yaml"
# Placeholders for the environment the profile reads, when the caller has none (the plan is
# offline).
PLACEHOLDER_ENV = {
    "SLURM_ACCOUNT": "ACCOUNT",
    "STILLROOM_CPU_PARTITION": "cpu",
    "STILLROOM_GPU_PARTITION": "gpu",
}
# The plan's processes see no SLURM configuration: they contact no controller (see above).
OFFLINE_ENV = {"SLURM_CONF": os.devnull}


class _Resources(dict):
    """A job's evaluated resources, read the way the plugin reads them (``.get`` and
    attributes)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(name) from exc


@dataclass
class Job:
    rule: str
    threads: int
    resources: dict[str, Any]
    wildcards: str = ""
    sbatch: str = ""
    # a server's allocation (rules/serve.smk): the jobs of each rule it holds besides the server
    clients: dict[str, int] = field(default_factory=dict)


@dataclass
class RulePlan:
    rule: str
    jobs: int
    sbatch: str
    array: bool = False
    clients: dict[str, int] = field(default_factory=dict)  # in all its allocations, by rule


def _value(raw: str) -> Any:
    try:
        return int(raw)
    except ValueError:
        return raw


def parse_dry_run(text: str) -> list[Job]:
    """The jobs of a ``snakemake --dry-run`` log, each with its rule, wildcards, threads and
    resources; a group (a server and its clients, indented under "Group job") as one job, as it
    is submitted (``_group``)."""
    jobs, block, groups = [], None, []
    for line in text.splitlines():
        if re.search(r"\] Group job \S+", line):
            groups.append([])
            continue
        head = re.match(r"^(\s*)(?:local)?rule (\w+):$", line)
        if head:
            block = {"rule": head.group(2), "grouped": bool(head.group(1)) and bool(groups)}
            continue
        item = re.match(r"^\s+(wildcards|threads|resources): (.*)$", line)
        if block is not None and item:
            block[item.group(1)] = item.group(2)
            # resources: the last line of a job's block
            if item.group(1) == "resources":
                resources = dict(
                    kv.split("=", 1) for kv in block["resources"].split(", ") if "=" in kv
                )
                job = Job(
                    block["rule"],
                    int(block.get("threads", 1)),
                    {k: _value(v) for k, v in resources.items()},
                    block.get("wildcards", ""),
                )
                (groups[-1] if block["grouped"] else jobs).append(job)
                block = None
    return jobs + [_group(members) for members in groups if members]


def _group(members: list[Job]) -> Job:
    """A group's one sbatch job, its resources as Snakemake sums a service group's (members run at
    once: each number summed, runtime the longest), named by its server's rule."""
    server = next((j for j in members if j.rule.startswith("serve_")), members[0])
    resources = dict(server.resources)
    for key, value in server.resources.items():
        if isinstance(value, int):
            values = [v for j in members if isinstance(v := j.resources.get(key, 0), int)]
            resources[key] = max(values) if key == "runtime" else sum(values)
    clients: dict[str, int] = {}
    for job in members:
        if job is not server:
            clients[job.rule] = clients.get(job.rule, 0) + 1
    threads = sum(j.threads for j in members)
    return Job(server.rule, threads, resources, server.wildcards, clients=clients)


def dry_run_jobs(
    configfiles: Sequence[str | Path],
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> list[Job]:
    """Every job of ``snakemake -n --forceall --profile profiles/slurm`` with its threads,
    resources, sbatch line and wildcards (a training phase's by its name). Runs in a scratch
    directory, so nothing under results/ is read or written."""
    env = snakemake_env({**PLACEHOLDER_ENV, **os.environ, **(env or {}), **OFFLINE_ENV})
    with tempfile.TemporaryDirectory(prefix="slurm-plan-") as work:
        # A large --cores: a dry run otherwise caps every job's threads at 1 (a real SLURM run does
        # not cap).
        args = snakemake_command(
            work,
            "--profile",
            str(PROFILE.parent),
            "--workflow-profile",
            str(REPO / "profiles" / "default"),
            "--dry-run",
            "--forceall",
            "--cores",
            "100000",
            *extra,
            configfiles=configfiles,
        )[3:]  # snakemake's arguments, less "python -m snakemake"
        cmd = [sys.executable, "-m", "stillroom.plan.slurm_dry_run", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    if proc.returncode:
        raise RuntimeError(
            f"snakemake dry run failed ({proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )
    return [Job(**job) for job in json.loads(proc.stdout)]


def sbatch_line(job: Job, settings: Mapping[str, Any]) -> str:
    """The sbatch call the plugin builds for ``job`` (less its per-run name, log and comment)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    plugin_job = SimpleNamespace(
        name=job.rule, threads=job.threads, resources=_Resources(job.resources)
    )
    account = str(job.resources.get("slurm_account", ""))
    params = {
        "run_uuid": "RUN",
        "slurm_logfile": "LOG",
        "comment_str": f"rule_{job.rule}",
        "workdir": None,
        "account": f" -A {shlex.quote(account)}" if account else "",
        "partition": f" -p {shlex.quote(str(job.resources['slurm_partition']))}"
        if job.resources.get("slurm_partition")
        else "",
    }
    plugin_settings = SimpleNamespace(
        requeue=bool(settings.get("slurm-requeue")),
        no_requeue=bool(settings.get("slurm-no-requeue")),
        qos=settings.get("slurm-qos"),
        reservation=settings.get("slurm-reservation"),
    )
    call = get_submit_command(plugin_job, params, settings=plugin_settings) + set_gres_string(
        plugin_job
    )
    # Drop the per-run parts that say nothing about resources.
    call = re.sub(r" --(job-name|output|comment) \S+", "", call)
    return re.sub(r"\s+", " ", call.replace("--parsable ", "")).strip()


def plan(
    configfiles: Sequence[str | Path],
    env: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> dict[str, RulePlan]:
    """One entry per rule: how many jobs, and their sbatch line. Resources depend on the config,
    not on wildcards, except where the config gives jobs of one rule their own shapes (training
    phases with a layout of their own, an effort group's generation jobs): then one entry per
    shape, ``rule[wildcards]`` its jobs share and the other shapes' do not
    (``train[phase=medium]``, ``generate[efforts=low+high+xhigh]``)."""
    settings = yaml.safe_load(PROFILE.read_text())
    arrays = {r.strip() for r in str(settings.get("slurm-array-jobs", "")).split(",") if r.strip()}
    shapes: dict[str, dict[str, list[Job]]] = {}
    for job in dry_run_jobs(configfiles, env, extra):
        if job.rule != "all":
            shapes.setdefault(job.rule, {}).setdefault(job.sbatch, []).append(job)
    plans: dict[str, RulePlan] = {}
    for rule, by_line in shapes.items():
        for line, jobs in by_line.items():
            key = rule if len(by_line) == 1 else f"{rule}[{_shape(jobs, by_line.values())}]"
            clients: dict[str, int] = {}
            for job in jobs:
                for client, n in job.clients.items():
                    clients[client] = clients.get(client, 0) + n
            plans[key] = RulePlan(rule, len(jobs), line, clients=clients)
    for p in plans.values():
        p.array = p.rule in arrays and p.jobs > 1
        if p.array:
            p.sbatch += f" --array=1-{p.jobs}"
    return plans


def _shape(jobs: list[Job], shapes: Iterable[list[Job]]) -> str:
    """The wildcards every one of ``jobs`` has and not every job of the rule (its first job's, if
    none)."""

    def common(js: list[Job]) -> set[str]:
        return set.intersection(*(set(j.wildcards.split(", ")) for j in js))

    everywhere = set.intersection(*(common(js) for js in shapes))
    own = [w for w in jobs[0].wildcards.split(", ") if w in common(jobs) - everywhere]
    return ",".join(own) or jobs[0].wildcards.replace(", ", ",")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan's options, for ``stillroom plan`` and ``python -m stillroom.plan.slurm``."""
    parser.add_argument(
        "--configfile",
        action="extend",
        nargs="+",
        metavar="YAML",
        help="an experiment config, then overlays: after one --configfile (as Snakemake takes "
        "them) or each after its own (default: config/config.yaml, as Snakemake's)",
    )


def print_plan(configfiles: Sequence[str | Path] | None) -> None:
    """The plan of ``configfiles`` (none: the embedded default), one line per rule or shape."""
    plans = plan(configfiles or [REPO / "config" / "config.yaml"])
    width = max([26, *(len(key) for key in plans)])
    for key, p in sorted(plans.items()):
        held = ", ".join(f"{n} {rule}" for rule, n in sorted(p.clients.items()))
        line = f"{key:<{width}} {p.jobs:>5} job(s)  {p.sbatch}"
        print(line + (f"  # with {held} jobs" if held else ""))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m stillroom.plan.slurm", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    print_plan(args.configfile)


if __name__ == "__main__":
    main()
