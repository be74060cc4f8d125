"""The jobs of the workflow's one generation rule, ``generate`` (rules/generate.smk): one per
(teacher, effort key, shard). An effort alone is its own key, so its file is
gen/<teacher>/<effort>/shard-<shard>.jsonl; the efforts of one of generation.effort_groups share a
job (one server start) and its one file, keyed by their names joined by JOIN."""

from __future__ import annotations

from ..config import Generation

RULE = "generate"
# Joins a group's efforts into its key: "+" is not in an effort's name (config.base.Effort), and a
# path segment, wildcard value and SLURM comment take it as it is.
JOIN = "+"


def effort_keys(generation: Generation) -> dict[str, list[str]]:
    """Each generation job's effort key -> the efforts it generates, in order: every effort outside
    effort_groups alone, then each group."""
    grouped = {e for g in generation.effort_groups for e in g}
    alone = {e: [e] for e in generation.efforts if e not in grouped}
    return alone | {JOIN.join(g): list(g) for g in generation.effort_groups}


def effort_key(generation: Generation, effort: str) -> str:
    """The key of the job that generates ``effort``."""
    return next(k for k, efforts in effort_keys(generation).items() if effort in efforts)


def teacher_servers(generation: Generation, teacher: str) -> list[str]:
    """The {server} names of ``teacher``'s servers: generation.servers, no more than it has shards
    (a server with no shard would start for nothing)."""
    shards = max(generation.shards_of(e) for e in generation.efforts_of(teacher))
    return [f"{i:03d}" for i in range(min(generation.servers, shards))]


def server_of(generation: Generation, shard: str | int) -> str:
    """The {server} of the server that a shard's generation jobs are clients of."""
    return f"{int(shard) % generation.servers:03d}"


def gpu_key(generation: Generation, teacher: str) -> str:
    """The cost.gpus key of ``teacher``'s generation jobs: ``generate`` for generation.teacher,
    ``generate-<teacher>`` for another (its server has a shape of its own), as a training phase
    with a layout of its own is ``train-<phase>``."""
    return RULE if teacher == generation.teacher else f"{RULE}-{teacher}"
