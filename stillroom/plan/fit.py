"""Job shapes against the cluster they go to, before anything is submitted.

A job that no node of its partition can hold waits in ``PD (PartitionConfig)`` (or
``ReqNodeNotAvail``) forever, and the executor says nothing. So the workflow's ``onstart`` (under
the SLURM executor) reads the nodes from ``scontrol show node``, checks each job's CPUs per node
(threads x tasks per node), memory per node, GPUs per node and node count against the nodes of its
partition, and refuses a shape no node can hold in one line naming the rule, what it asks and what
the partition's largest node has. The account the profile charges is checked against ``sacctmgr``
there too: the executor plugin checks it per job at submission, where a refusal is a failed job
that ``retries`` resubmits with more memory.
"""

from __future__ import annotations

import getpass
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    mem_mb: int
    gpus: int
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class Shape:
    """What one job asks, per node (as sbatch counts it)."""

    rule: str
    partition: str
    cpus: int
    mem_mb: int
    gpus: int
    nodes: int

    def fits(self, node: Node) -> bool:
        return self.cpus <= node.cpus and self.mem_mb <= node.mem_mb and self.gpus <= node.gpus


def parse_nodes(text: str) -> list[Node]:
    """``scontrol show node -o`` (one node a line) as Nodes."""
    nodes = []
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "NodeName" not in fields:
            continue
        gpus = re.search(r"gpu(?::[^:,(]+)?:(\d+)", fields.get("Gres", ""))
        nodes.append(
            Node(
                name=fields["NodeName"],
                cpus=int(fields.get("CPUTot", 0)),
                mem_mb=int(fields.get("RealMemory", 0)),
                gpus=int(gpus[1]) if gpus else 0,
                partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p),
            )
        )
    return nodes


def cluster_nodes() -> list[Node]:
    """The cluster's nodes, from ``scontrol``."""
    out = subprocess.run(
        ["scontrol", "show", "node", "-o"], capture_output=True, text=True, timeout=60
    )
    if out.returncode:
        raise RuntimeError(f"scontrol show node failed: {out.stderr.strip()}")
    return parse_nodes(out.stdout)


def job_shape(rule: str, threads: int, resources: Mapping[str, Any]) -> Shape:
    """A job's shape as the executor plugin submits it: ``--cpus-per-task`` threads for each task
    on a node, ``--mem`` per node, ``--gpus`` (one node) or ``--gres=gpu:N`` per node."""
    nodes = int(resources.get("nodes") or 1)
    tasks = int(resources.get("tasks") or 1)
    gres = re.search(r"gpu(?::[^:,]+)?:(\d+)", str(resources.get("gres") or ""))
    gpus = int(gres[1]) if gres else int(resources.get("gpu") or 0)
    return Shape(
        rule=rule,
        partition=str(resources.get("slurm_partition") or ""),
        cpus=int(threads) * max(1, -(-tasks // nodes)),
        mem_mb=int(resources.get("mem_mb") or 0),
        gpus=gpus,
        nodes=nodes,
    )


def refusal(shape: Shape, nodes: Iterable[Node]) -> str | None:
    """Why no set of nodes of the job's partition can hold it, in one line; None when some can."""
    members = [n for n in nodes if shape.partition in n.partitions]
    if not members:
        return f"rule {shape.rule}: partition {shape.partition!r} has no nodes (scontrol)"
    if sum(shape.fits(n) for n in members) >= shape.nodes:
        return None
    big = max(members, key=lambda n: (n.cpus, n.mem_mb, n.gpus))
    return (
        f"rule {shape.rule} asks {shape.cpus} CPUs, {shape.mem_mb} MB, {shape.gpus} GPUs per "
        f"node on {shape.nodes} node(s); partition {shape.partition}'s largest node ({big.name}) "
        f"has {big.cpus} CPUs, {big.mem_mb} MB, {big.gpus} GPUs ({len(members)} node(s))"
    )


def refusals(shapes: Iterable[Shape], nodes: list[Node]) -> list[str]:
    """One line per rule whose shape no node holds (a rule's jobs share it but for phases)."""
    return list(dict.fromkeys(r for s in dict.fromkeys(shapes) if (r := refusal(s, nodes))))


def account_problem(account: str, user: str | None = None) -> str | None:
    """Why ``account`` cannot be charged by ``user`` (sacctmgr's associations), in one line."""
    user = user or getpass.getuser()
    out = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", "format=account"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode:
        return f"sacctmgr could not list the accounts of {user}: {out.stderr.strip()}"
    accounts = sorted({a.strip() for a in out.stdout.splitlines() if a.strip()})
    if not account:
        return (
            f"SLURM_ACCOUNT is empty: set it to an account of {user} "
            f"(sacctmgr lists: {', '.join(accounts) or 'none'})"
        )
    if account.lower() not in {a.lower() for a in accounts}:
        return (
            f"SLURM_ACCOUNT={account} is not an account of {user} "
            f"(sacctmgr lists: {', '.join(accounts) or 'none'})"
        )
    return None
