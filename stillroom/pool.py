"""Stage 1 and 3: the prompt pool with its held-out test and dev splits, and shard assignment."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from .ids import bucket, normalize_prompt, shard_of
from .io import DataError, read_jsonl, write_jsonl
from .sources import iter_sources

POOL_KEYS = ("prompt_id", "source", "kind", "prompt", "answer")
GENERATED = ("arithmetic", "choice", "kernels")  # sources the held-out splits are carved from


def build_pool(
    *,
    benchmarks: Mapping[str, str],
    out_pool: str,
    out_heldout: str,
    out_dev: str,
    params: Mapping[str, Any],
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """Deduplicate all sources by prompt id, then move the ``heldout.size`` generated problems with the
    lowest id hash into the held-out test split and the next ``heldout.dev_size`` into the dev split
    (for choices such as the merge ratio, never reported). Disjoint by construction (each id lands in
    exactly one file); checked again on normalised text before anything is written."""
    seed = params["seed"]
    records: dict[str, dict[str, Any]] = {}
    duplicates = 0
    for rec in iter_sources(params["sources"], benchmarks, seed):
        if rec["prompt_id"] in records:
            duplicates += 1
            continue
        records[rec["prompt_id"]] = rec
    generated = {s["name"] for s in params["sources"] if s["kind"] in GENERATED}
    candidates = sorted(
        (r for r in records.values() if r["source"] in generated),
        key=lambda r: (bucket(f"{seed}:{r['prompt_id']}", 1 << 62), r["prompt_id"]),
    )
    size, dev_size = params["heldout"]["size"], params["heldout"].get("dev_size", 0)
    if size + dev_size > len(candidates) // 2:
        raise DataError(
            f"heldout.size={size} + heldout.dev_size={dev_size} would take more than half of the "
            f"{len(candidates)} generated problems"
        )
    heldout, dev = candidates[:size], candidates[size : size + dev_size]
    held_ids = {r["prompt_id"] for r in heldout + dev}
    pool = [r for r in records.values() if r["prompt_id"] not in held_ids]

    def text(r: Mapping[str, Any]) -> str:
        return normalize_prompt(r["prompt"]).lower()

    for name, split, others in (("held-out", heldout, pool + dev), ("dev", dev, pool)):
        seen = {text(r) for r in split}
        leaked = [r["prompt_id"] for r in others if text(r) in seen]
        if leaked:
            raise DataError(
                f"{name} split shares prompt text with {len(leaked)} other prompts, e.g. {leaked[:3]}"
            )
    write_jsonl(out_pool, pool)
    write_jsonl(out_heldout, heldout)
    write_jsonl(out_dev, dev)
    per_source = Counter(r["source"] for r in pool)
    log(
        f"pool: {len(pool)} prompts {dict(per_source)}; held-out: {len(heldout)}; dev: {len(dev)}; "
        f"duplicates dropped: {duplicates}"
    )
    return {
        "pool": len(pool),
        "heldout": len(heldout),
        "dev": len(dev),
        "duplicates_dropped": duplicates,
        "per_source": dict(per_source),
        "heldout_kinds": dict(Counter(r["kind"] for r in heldout)),
    }


def assign_shards(
    *,
    pool: str,
    out_shards: list[str],
    params: Mapping[str, Any],
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """Shard i holds the prompts whose id hash is i modulo the shard count — never row order, so adding
    prompts to a source moves no existing prompt to another shard."""
    n = params["shards"]
    if len(out_shards) != n:
        raise DataError(f"shards={n} but {len(out_shards)} output paths were given")
    rows = read_jsonl(pool, required=POOL_KEYS)
    parts: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for row in rows:
        parts[shard_of(row["prompt_id"], n)].append(row)
    for path, part in zip(out_shards, parts):
        write_jsonl(path, part)
    sizes = [len(p) for p in parts]
    log(f"{len(rows)} prompts into {n} shards: {sizes}")
    return {"shard_sizes": sizes}
