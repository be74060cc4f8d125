"""The offline stand-in for a real reasoning teacher.

It answers the generated problems of ``stillroom.data.sources`` from their structured form with a
worked solution inside ``<think>…</think>`` and a boxed final answer, and the project's kernel
problems with a plan and the problem's reference Triton solution in a code block
(``stillroom.teachers.kernel``). Effort levels map to how much of the reasoning it writes (clearly
different lengths; with ``detail_spread`` a prompt's samples differ too), and with probability
``error_rate`` (per effort, optionally) it slips — a wrong
intermediate result carried to a wrong final answer; for a kernel, torch code that is right but is
not Triton (the rule reward's case) or a kernel that stores a wrong value — so grading has something
to reject. Deterministic in (seed, prompt id, effort, sample index).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ..config import PROCEDURAL_DETAIL, ProceduralSpec
from ..data.sources import LETTERS, worked_solution
from ..io import DataError
from .base import Completion, Teacher


class ProceduralTeacher(Teacher):
    Spec = ProceduralSpec

    def complete(
        self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int
    ) -> Completion:
        detail = {**PROCEDURAL_DETAIL, **self.spec["detail"]}
        if effort not in detail:
            raise ValueError(
                f"teacher '{self.name}': no detail level for effort '{effort}' "
                f"(have {sorted(detail)})"
            )
        meta = problem.get("meta") or {}
        if "op" not in meta and "solution" not in meta:
            raise DataError(
                f"teacher '{self.name}' (procedural) can only answer generated problems and the "
                f"project's kernel problems; prompt {problem.get('prompt_id')} from source "
                f"'{problem.get('source')}' has no meta.op or meta.solution"
            )
        rng = random.Random(f"{seed}:{problem['prompt_id']}:{effort}:{sample_index}")
        rate = self.spec["error_rate"]
        rate = rate.get(effort, 0.0) if isinstance(rate, Mapping) else rate
        slip = rng.random() < rate
        level, spread = detail[effort], self.spec["detail_spread"]
        if spread:  # drawn only then: a run without a spread keeps its bytes
            level = min(3, max(0, level + rng.randint(-spread, spread)))
        if problem["kind"] == "kernel":
            from .kernel import kernel_solution

            reasoning, final = kernel_solution(
                problem["prompt"],
                meta["solution"],
                level,
                rng.choice(["torch", "wrong"]) if slip else None,
                family=meta.get("family"),
                note=self.notes.add_file,
            )
        else:
            result: int | str = problem["answer"]
            if slip and problem["kind"] == "choice":
                result = rng.choice([L for L in LETTERS[: len(meta["options"])] if L != result])
            elif slip:
                result = int(result) + rng.choice([-2, -1, 1, 2])
            reasoning, final = worked_solution(meta, result, level)
        text = f"<think>{reasoning}</think>\n{final}"
        return Completion(
            text=text,
            finish_reason="stop",
            prompt_tokens=len(problem["prompt"].split()),
            completion_tokens=len(text.split()),
            model=f"procedural/{self.name}",
            reasoning=reasoning,
        )
