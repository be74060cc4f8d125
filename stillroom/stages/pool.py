"""Rules benchmark, pool and shard: benchmarks materialised from dataset specs, the prompt pool
with its held-out test and dev splits, and the pool split into shards by prompt-id hash."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from ..config import DatasetSpec, Experiment, Heldout, Source, StageParams
from ..config.data import GENERATED, local_spec
from ..data.records import POOL_KEYS
from ..data.sources import dataset_records, iter_source_rows, load_benchmark
from ..ids import bucket, normalize_prompt, shard_of
from ..io import DataError, read_jsonl, write_jsonl
from ..provenance.sidecars import Notes
from .contract import stage


class BenchmarkParams(StageParams):
    name: str
    spec: DatasetSpec


def benchmark_job_params(exp: Experiment, bench: str, root: Path) -> BenchmarkParams:
    """The params of rule benchmark's job for ``bench``: its dataset spec, a local file resolved
    against the repository ``root``."""
    return BenchmarkParams(
        seed=exp.seed, name=bench, spec=local_spec(exp.benchmarks[bench].dump(), root)
    )


@stage(
    "benchmark",
    params=BenchmarkParams,
    outputs=("benchmark",),
    help="materialise a benchmark from a hub id or a local file as prompt/answer/kind JSONL",
)
def fetch_benchmark(
    *,
    out_benchmark: str,
    params: Mapping[str, Any] | BenchmarkParams,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    """A benchmark given as a dataset spec (hub id or file) as a JSONL of prompt/answer/kind."""
    p = BenchmarkParams.parse(params, where="benchmark")
    keys = ("prompt_id", "prompt", "answer", "kind")
    rows, first = [], {}
    for r in dataset_records(p.spec, p.name, log, notes):
        # evaluation pairs answers by prompt id: a problem listed twice is refused here, where
        # the dataset's rows are still known, rather than when evaluation starts
        if r["prompt_id"] in first:
            raise DataError(
                f"benchmark '{p.name}': {p.spec.path} rows {first[r['prompt_id']]} and "
                f"{r['meta']['row']} give the same prompt (prompt id {r['prompt_id']}, from the "
                "text with whitespace and Unicode normalised); a benchmark lists each problem "
                "once: filter one out (where) or dedupe the file"
            )
        first[r["prompt_id"]] = r["meta"]["row"]
        rows.append({k: r[k] for k in keys})
    if not rows:
        raise DataError(f"benchmark '{p.name}': no rows from {p.spec.path}")
    write_jsonl(out_benchmark, rows)
    log(f"benchmark {p.name}: {len(rows)} items from {p.spec.path}")
    return {"items": len(rows)}


class PoolParams(StageParams):
    sources: Annotated[list[Source], Field(min_length=1)]
    heldout: Heldout


def pool_job_params(exp: Experiment, root: Path) -> PoolParams:
    """The params of the pool job: the sources, local files resolved against the repository
    ``root``, and the held-out split."""
    sources = [local_spec(s.dump(), root) for s in exp.sources]
    return PoolParams(seed=exp.seed, sources=sources, heldout=exp.heldout)


@stage(
    "pool",
    params=PoolParams,
    inputs=("benchmarks*",),
    outputs=("pool", "heldout", "dev"),
    help="build the prompt pool and the held-out test and dev splits from the configured sources",
)
def build_pool(
    *,
    benchmarks: Mapping[str, str],
    out_pool: str,
    out_heldout: str,
    out_dev: str,
    params: Mapping[str, Any] | PoolParams,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    """Deduplicate all sources by prompt, then move the ``heldout.size`` generated problems with
    the lowest id hash into the held-out test split and the next ``heldout.dev_size`` into the dev
    split (for choices such as the merge ratio, never reported). Disjoint by construction (each id
    lands in exactly one file); checked again on normalised text before anything is written.

    Every benchmark is read first: this is the first job that has them all, so a bad one (a
    problem listed twice) stops here rather than when evaluation starts. One prompt is the same
    prompt in any source when its normalised text (``normalize_prompt``: what its id hashes) is:
    a second copy with the same kind and answer is dropped and counted, one with another is an
    error naming both rows."""
    p = PoolParams.parse(params)  # its keys are top-level config keys
    seed = p.seed
    for name, path in benchmarks.items():
        load_benchmark(path, f"benchmark '{name}'", benchmark=name)
    records: dict[str, dict[str, Any]] = {}
    first: dict[str, tuple[str, dict[str, Any]]] = {}  # prompt text -> (where, record)
    duplicates = 0
    for where, rec in iter_source_rows(p.sources, benchmarks, seed, log, notes):
        text = normalize_prompt(rec["prompt"])
        if text in first:
            _same_gold(first[text], (where, rec))
            duplicates += 1
            continue
        first[text] = (where, rec)
        records[rec["prompt_id"]] = rec
    carved = set(p.heldout.sources or (s.name for s in p.sources if s.kind in GENERATED))
    candidates = sorted(
        (r for r in records.values() if r["source"] in carved),
        key=lambda r: (bucket(f"{seed}:{r['prompt_id']}", 1 << 62), r["prompt_id"]),
    )
    size, dev_size = p.heldout.size, p.heldout.dev_size
    if size + dev_size > len(candidates) // 2:
        raise DataError(
            f"heldout.size={size} + heldout.dev_size={dev_size} would take more than half of the "
            f"{len(candidates)} problems of {', '.join(sorted(carved)) or 'no source'}"
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
                f"{name} split shares prompt text with {len(leaked)} other prompts, "
                f"e.g. {leaked[:3]}"
            )
    write_jsonl(out_pool, pool)
    write_jsonl(out_heldout, heldout)
    write_jsonl(out_dev, dev)
    per_source = Counter(r["source"] for r in pool)
    log(
        f"pool: {len(pool)} prompts {dict(per_source)}; held-out: {len(heldout)}; dev: {len(dev)}; "
        f"duplicates dropped (same prompt and answer): {duplicates}"
    )
    return {
        "pool": len(pool),
        "heldout": len(heldout),
        "dev": len(dev),
        "duplicates_dropped": duplicates,
        "per_source": dict(per_source),
        "heldout_kinds": dict(Counter(r["kind"] for r in heldout)),
    }


def _same_gold(a: tuple[str, Mapping[str, Any]], b: tuple[str, Mapping[str, Any]]) -> None:
    """Two rows of one prompt must agree on its kind and gold answer (surrounding whitespace
    aside): which one the pool kept would otherwise depend on source order, silently."""
    (where_a, ra), (where_b, rb) = a, b
    if ra["kind"] == rb["kind"] and ra["answer"].strip() == rb["answer"].strip():
        return
    if ra["kind"] == rb["kind"]:
        golds = f"{ra['answer']!r:.80} and {rb['answer']!r:.80}"
    else:
        golds = (
            f"{ra['answer']!r:.80} (kind {ra['kind']}) and {rb['answer']!r:.80} (kind {rb['kind']})"
        )
    raise DataError(
        f"{where_a} and {where_b} give one prompt different answers: {golds}; a prompt has one "
        f"gold answer: fix or drop one of the rows (prompt: {ra['prompt']!r:.100})"
    )


class ShardParams(StageParams):
    shards: int = Field(ge=1)


def shard_job_params(exp: Experiment) -> ShardParams:
    """The params of the shard job: generation.shards."""
    return ShardParams(seed=exp.seed, shards=exp.generation.shards)


@stage(
    "shard",
    params=ShardParams,
    inputs=("pool",),
    outputs=("shards*",),
    help="split the pool into shards by prompt-id hash",
)
def assign_shards(
    *,
    pool: str,
    out_shards: list[str],
    params: Mapping[str, Any] | ShardParams,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Shard i holds the prompts whose id hash is i modulo the shard count — never row order, so
    adding prompts to a source moves no existing prompt to another shard."""
    n = ShardParams.parse(params, where="generation").shards
    if len(out_shards) != n:
        raise DataError(f"shards={n} but {len(out_shards)} output paths were given")
    rows = read_jsonl(pool, required=POOL_KEYS)
    parts: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    for row in rows:
        parts[shard_of(row["prompt_id"], n)].append(row)
    for path, part in zip(out_shards, parts, strict=True):
        write_jsonl(path, part)
    sizes = [len(p) for p in parts]
    log(f"{len(rows)} prompts into {n} shards: {sizes}")
    return {"shard_sizes": sizes}
