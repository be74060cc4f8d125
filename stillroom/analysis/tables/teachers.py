"""The teachers table: when efforts go to different teachers, trace lengths per (teacher, effort) on
the prompts every one of them answered, each other teacher against the reference teacher."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ...io import DataError, iter_jsonl
from ..stats import paired_bootstrap
from . import render
from .cells import gold_sources, token_cells
from .render import Column, Grid, fmt, interval, ratio
from .schema import frame, named_rows


class Cell(NamedTuple):
    """The traces of one teacher at one effort."""

    teacher: str
    effort: str


@dataclass
class TeacherTable:
    df: pd.DataFrame
    caption: str
    pct: int
    reference: str

    def markdown(self) -> str:
        pct, ref = self.pct, self.reference
        grid = Grid(
            [
                Column("teacher", lambda r: r.teacher),
                Column("effort", lambda r: r.effort),
                Column("samples", lambda r: f"{r.samples}"),
                Column("accuracy", lambda r: f"{r.accuracy:.3f}"),
                Column("mean tokens", lambda r: f"{r.mean_tokens:.1f}"),
                Column(f"vs {ref} at", lambda r: fmt(r.reference_effort, "", "— (reference)")),
                Column(
                    f"Δ tokens [{pct}% CI]",
                    lambda r: interval(r.delta_tokens, r.tokens_ci_low, r.tokens_ci_high, "+.1f"),
                ),
                Column(f"× {ref}", lambda r: ratio(r.token_ratio)),
            ],
            named_rows(self.df),
        )
        return render.markdown(self.caption, grid)

    def summary(self) -> dict[str, Any]:
        rows = named_rows(self.df)
        return {
            "prompts_shared": int(rows[0].prompts_shared),
            "mean_tokens": {
                f"{r.teacher}@{r.effort}": round(r.mean_tokens, 3)
                for r in named_rows(self.df.drop_duplicates(["teacher", "effort"]))
            },
            "token_ratio": {
                f"{r.teacher}@{r.effort} vs {r.reference_teacher}@{r.reference_effort}": round(
                    r.token_ratio, 4
                )
                for r in rows
                if not pd.isna(r.reference_teacher) and not pd.isna(r.token_ratio)
            },
        }


def teachers(
    graded: Mapping[str, str],
    reference: str,
    teachers: Mapping[str, str],
    n_resamples: int,
    confidence: float,
    seed: int,
) -> TeacherTable:
    """Trace lengths per (teacher, effort) on the prompts every one of them answered, from the
    graded generation shards (``graded``; ``teachers``: effort -> its teacher, in order): accuracy
    and mean completion tokens (per-prompt means, averaged), and for each other teacher's row
    against the reference teacher at each of its efforts, the paired mean-token difference with its
    bootstrap CI over the shared prompts and the token ratio. One-level bootstrap over prompts (a
    prompt's failed samples leave it fewer, so samples per prompt may differ). Samples that failed
    or were skipped wrote no trace and are left out."""
    ref = reference
    if ref not in teachers.values():
        raise DataError(f"tables: the reference teacher '{ref}' generates none of {list(teachers)}")
    # each cell's samples per prompt: (correct, completion tokens)
    cells: dict[Cell, dict[str, list[tuple[float, float]]]] = {
        Cell(t, e): {} for e, t in teachers.items()
    }
    required = ("key", "prompt_id", "teacher", "effort", "grade", "completion_tokens")
    excluded: dict[str, set[str]] = {}
    for path in graded.values():
        for r in iter_jsonl(path, required=required):
            if r["grade"].get("status") == "gold_unparseable":
                # a benchmark bug, not a wrong trace: the prompt is left out of every cell
                excluded.setdefault(r.get("source", "unknown"), set()).add(r["prompt_id"])
                continue
            cell = Cell(r["teacher"], r["effort"])
            if cell not in cells:
                owner = teachers.get(r["effort"])
                why = f"gives that effort to '{owner}'" if owner else "generates no such effort"
                raise DataError(
                    f"{path}: {r['key']} was written by '{r['teacher']}' at effort "
                    f"'{r['effort']}', but the config {why}"
                )
            if not (r.get("error") or r.get("skipped")):
                sample = (float(bool(r["grade"].get("correct"))), float(r["completion_tokens"]))
                cells[cell].setdefault(r["prompt_id"], []).append(sample)
    for (teacher, effort), prompts in cells.items():
        if not prompts:
            raise DataError(f"tables: no traces of teacher '{teacher}' at effort '{effort}'")
    dropped = set().union(*excluded.values())
    shared = sorted(set.intersection(*(set(c) for c in cells.values())) - dropped)
    if not shared:
        raise DataError(
            "tables: no prompt was answered by every (teacher, effort): "
            + ", ".join(f"{t}@{e} {len(c)}" for (t, e), c in cells.items())
        )
    # reference teacher first, then the others in the order they first generate
    order = sorted(
        cells, key=lambda c: (c.teacher != ref, list(teachers.values()).index(c.teacher))
    )
    stats = {}
    for cell in order:
        per_prompt = np.array([np.mean(cells[cell][pid], axis=0) for pid in shared])
        stats[cell] = {
            "samples": sum(len(cells[cell][pid]) for pid in shared),
            "prompts": len(cells[cell]),
            "accuracy": per_prompt[:, 0],
            "tokens": per_prompt[:, 1],
        }
    boot = {"n_resamples": n_resamples, "confidence": confidence, "seed": seed}
    refs = [c for c in order if c.teacher == ref]
    rows = []
    for cell in order:
        mine = stats[cell]
        for other in [None] if cell.teacher == ref else refs:
            c = (
                None
                if other is None
                else paired_bootstrap(mine["tokens"], stats[other]["tokens"], **boot)
            )
            solved = other is not None and mine["accuracy"].any() and stats[other]["accuracy"].any()
            rows.append(
                {
                    "teacher": cell.teacher,
                    "effort": cell.effort,
                    "prompts": mine["prompts"],
                    "prompts_shared": len(shared),
                    "samples": mine["samples"],
                    "accuracy": float(mine["accuracy"].mean()),
                    "mean_tokens": float(mine["tokens"].mean()),
                    "reference_teacher": None if other is None else other.teacher,
                    "reference_effort": None if other is None else other.effort,
                    **token_cells(c, solved),
                }
            )
    pct = round(100 * confidence)
    caption = (
        f"Teacher traces on the {len(shared)} prompts every (teacher, effort) below answered. "
        "Efforts limited to a subset of the shards (generation.effort_shards) share only that "
        "subset, so an effort run on every prompt is cut down to it here (its own prompt count is "
        "in the CSV). Accuracy and mean completion tokens: per-prompt means, averaged. Against "
        f"the reference teacher {ref} (generation.teacher) at each of its efforts: Δ mean tokens "
        f"with a paired bootstrap over the shared prompts ({n_resamples} resamples), {pct}% CI, "
        f"and × {ref}, the ratio of mean tokens. Each effort has one teacher, so a difference "
        "mixes the change of teacher with the change of effort: read × against the spacing one "
        "teacher gives those efforts. Failed and skipped samples wrote no trace and are left out; "
        "no ratio where either cell has no correct answer." + gold_sources(excluded)
    )
    return TeacherTable(frame("teachers", rows), caption, pct, ref)
