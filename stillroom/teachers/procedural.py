"""The offline stand-in for a real reasoning teacher.

It answers the generated problems of ``stillroom.sources`` from their structured form with a worked
solution inside ``<think>…</think>`` and a boxed final answer. Effort levels map to how much of the
solution it writes (clearly different lengths), and with probability ``error_rate`` (per effort,
optionally) it slips — a wrong intermediate result carried to a wrong final answer — so grading
has something to reject. Deterministic in (seed, prompt id, effort, sample index).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from ..io import DataError
from ..sources import LETTERS, worked_solution
from . import Completion, Teacher

DEFAULT_DETAIL = {"low": 0, "medium": 1, "high": 2, "xhigh": 3}


class ProceduralTeacher(Teacher):
    def complete(self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int) -> Completion:
        detail = {**DEFAULT_DETAIL, **self.spec.get("detail", {})}
        if effort not in detail:
            raise ValueError(f"teacher '{self.name}': no detail level for effort '{effort}' (have {sorted(detail)})")
        meta = problem.get("meta") or {}
        if "op" not in meta:
            raise DataError(f"teacher '{self.name}' (procedural) can only answer generated problems; "
                            f"prompt {problem.get('prompt_id')} from source '{problem.get('source')}' has no meta.op")
        rng = random.Random(f"{seed}:{problem['prompt_id']}:{effort}:{sample_index}")
        rate = self.spec.get("error_rate", 0.0)
        rate = rate.get(effort, 0.0) if isinstance(rate, Mapping) else rate
        result: int | str = problem["answer"]
        if rng.random() < rate:
            if problem["kind"] == "choice":
                result = rng.choice([L for L in LETTERS[: len(meta["options"])] if L != result])
            else:
                result = int(result) + rng.choice([-2, -1, 1, 2])
        reasoning, final = worked_solution(meta, result, detail[effort])
        text = f"<think>{reasoning}</think>\n{final}"
        return Completion(text=text, finish_reason="stop", prompt_tokens=len(problem["prompt"].split()),
                          completion_tokens=len(text.split()), model=f"procedural/{self.name}", reasoning=reasoning)
