"""Rules dataset and dataset_ablation: the SFT dataset, the traces ``dataset.select`` picks per
(prompt, effort) (by default the shortest correct one), effort-tagged; the ablation's datasets pick
them another way.

Every example carries the student's own effort syntax in a system turn, except a fraction of the
default-effort examples left untagged (half, in the distillation recipe), so that the untagged
behaviour stays the default effort's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from ..config import DatasetSelection, Experiment, StageParams, ValidatorOptions
from ..config.generation import Selection
from ..grading.formats import effort_tag, user_content
from ..ids import bucket
from ..io import DataError, iter_jsonl, write_jsonl
from ..provenance.sidecars import Notes
from .contract import stage

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


class Params(StageParams, DatasetSelection):
    effort_tag: str = Field(pattern=r"\$effort")
    kernel: ValidatorOptions = Field(
        ValidatorOptions(), description="the kernel reward sft_sources' rows are graded by"
    )
    # not this job's: each selection of the ablation is a job of its own (its ``select``), so
    # adding one never rebuilds the fine-tune's dataset
    ablation: list[Selection] = Field([], exclude=True)
    empty_unless_given = ("kernel",)

    def param_values(self) -> dict[str, Any]:
        """Without sft_sources, neither they nor the reward grading them: an experiment without
        them never sees its dataset's params change with theirs."""
        values = super().param_values()
        if not self.sft_sources:
            del values["sft_sources"], values["kernel"]
        return values


def job_params(exp: Experiment, selection: str | None = None) -> Params:
    """The params of rule dataset's job (dataset.select, the fine-tune's traces) or, given
    ``selection`` (rule dataset_ablation's {selection}), of the ablation's dataset of that
    selection; effort-tagged as student.effort_tag says."""
    dataset = exp.dataset.model_dump(exclude={"ablation"})
    kernel = {"kernel": exp.kernels.validator} if exp.kernels else {}
    return Params(
        seed=exp.seed,
        **{**dataset, "select": selection or dataset["select"]},
        effort_tag=exp.student.effort_tag,
        **kernel,
    )


def _rank(select: str, seed: int, rec: Mapping[str, Any]) -> tuple[Any, ...]:
    """A trace's place among its slot's candidates, lowest picked first; ties broken by sample
    index so that every choice is reproducible."""
    tokens, index = rec["completion_tokens"], rec["sample_index"]
    if select == "longest":
        return (-tokens, index)
    if select == "random":  # a draw per trace, fixed by the seed and the trace's key
        return (bucket(f"{seed}:select:{rec['key']}", 1 << 30), index)
    return (tokens, index)  # shortest; all and unfiltered keep every trace, shortest first


@stage(
    "dataset",
    params=Params,
    inputs=("graded*",),
    outputs=("dataset",),
    help="the traces dataset.select picks per prompt and effort (shortest correct), effort-tagged",
)
def build(
    *,
    graded: Mapping[str, str],
    out_dataset: str,
    params: Mapping[str, Any] | Params,
    threads: int = 1,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> dict[str, Any]:
    """``threads`` rows of sft_sources are graded at once."""
    p = Params.parse(params, where="dataset")
    seed, default = p.seed, p.default_effort
    chosen: dict[tuple[str, str], list[tuple[tuple[Any, ...], dict[str, Any], str]]] = {}
    seen: Counter[str] = Counter()
    correct: Counter[str] = Counter()
    for path in graded.values():
        for rec in iter_jsonl(path, required=GRADED_KEYS):
            seen[rec["effort"]] += 1
            right = bool(rec["grade"].get("correct"))
            correct[rec["effort"]] += right
            if not right and p.select != "unfiltered":
                continue
            slot = chosen.setdefault((rec["prompt_id"], rec["effort"]), [])
            slot.append((_rank(p.select, seed, rec), rec, path))
    sources, sft_rows = {}, []
    for spec in p.sft_sources:
        from ..data.kernelbook import grade

        kept, report = grade(spec, p.kernel, default, seed, threads, notes)
        log(
            f"sft source '{spec.name}': kept {report['kept']} of {report['rows']} rows; "
            f"dropped by reason {report['dropped_by_reason']}"
        )
        sft_rows += kept
        sources[spec.name] = report  # every dropped row with its reasons, in the sidecar
    if not chosen and not sft_rows:
        raise DataError(
            f"no correct samples in {len(graded)} graded shards: nothing to train on"
            if p.select != "unfiltered"
            else f"no samples in {len(graded)} graded shards: nothing to train on"
        )
    picked = []
    for slot, candidates in sorted(chosen.items()):
        candidates.sort(key=lambda c: c[0])
        keep = candidates if p.select in ("all", "unfiltered") else candidates[:1]
        picked += [(slot, rec, path) for _, rec, path in keep]
    rows = []
    for (pid, effort), rec, path in picked:
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
    rows += sft_rows
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
        "select": p.select,
        "examples": len(rows),
        "examples_correct": sum(bool(rec["grade"].get("correct")) for _, rec, _ in picked),
        "per_effort": dict(per_effort),
        "untagged": sum(not r["tagged"] for r in rows),
        "mean_completion_tokens": mean_tokens,
        "samples_seen": dict(seen),
        "samples_correct": dict(correct),
        **({"sft_sources": sources} if sources else {}),
    }
