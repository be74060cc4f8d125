"""Rule dataset: the SFT dataset, the shortest correct trace per (prompt, effort), effort-tagged.

Every example carries the student's own effort syntax in a system turn, except a fraction of the
default-effort examples left untagged (half, in the distillation recipe), so that the untagged
behaviour stays the default effort's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from ..config import DatasetSelection
from ..grading.formats import effort_tag, user_content
from ..ids import bucket
from ..io import DataError, iter_jsonl, write_jsonl

GRADED_KEYS = (
    "key",
    "prompt_id",
    "effort",
    "sample_index",
    "prompt",
    "response",
    "completion_tokens",
    "grade",
)


class Params(DatasetSelection):
    seed: int = 0
    effort_tag: str = Field(pattern=r"\$effort")


def build(
    *,
    graded: Mapping[str, str],
    out_dataset: str,
    params: Mapping[str, Any] | Params,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    p = Params.parse(params, where="dataset")
    seed, default = p.seed, p.default_effort
    best: dict[tuple[str, str], tuple[tuple[int, int], dict[str, Any], str]] = {}
    seen: Counter[str] = Counter()
    correct: Counter[str] = Counter()
    for path in graded.values():
        for rec in iter_jsonl(path, required=GRADED_KEYS):
            seen[rec["effort"]] += 1
            if not rec["grade"].get("correct"):
                continue
            correct[rec["effort"]] += 1
            # Shortest correct; ties broken by sample index so the choice is reproducible.
            rank = (rec["completion_tokens"], rec["sample_index"])
            slot = (rec["prompt_id"], rec["effort"])
            if slot not in best or rank < best[slot][0]:
                best[slot] = (rank, rec, path)
    if not best:
        raise DataError(f"no correct samples in {len(graded)} graded shards: nothing to train on")
    rows = []
    for (pid, effort), (_, rec, path) in sorted(best.items()):
        untagged = (
            effort == default and bucket(f"{seed}:{pid}", 10_000) < p.untagged_fraction * 10_000
        )
        messages = (
            [] if untagged else [{"role": "system", "content": effort_tag(p.effort_tag, effort)}]
        )
        messages += [
            {"role": "user", "content": user_content(rec)},
            {"role": "assistant", "content": rec["response"]},
        ]
        rows.append(
            {
                "id": rec["key"],
                "prompt_id": pid,
                "effort": effort,
                "tagged": not untagged,
                "messages": messages,
                "completion_tokens": rec["completion_tokens"],
                "source_record": {"file": path, "key": rec["key"]},
            }
        )
    write_jsonl(out_dataset, rows)
    per_effort = Counter(r["effort"] for r in rows)
    tokens: defaultdict[str, list[int]] = defaultdict(list)
    for r in rows:
        tokens[r["effort"]].append(r["completion_tokens"])
    mean_tokens = {e: round(sum(v) / len(v), 1) for e, v in tokens.items()}
    log(
        f"{len(rows)} examples; per effort {dict(per_effort)}; "
        f"mean completion tokens {mean_tokens}; "
        f"teacher accuracy { ({e: round(correct[e] / seen[e], 3) for e in seen}) }"
    )
    return {
        "examples": len(rows),
        "per_effort": dict(per_effort),
        "untagged": sum(not r["tagged"] for r in rows),
        "mean_completion_tokens": mean_tokens,
        "samples_seen": dict(seen),
        "samples_correct": dict(correct),
    }
