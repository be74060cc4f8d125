"""The offline stand-in for a real reasoning teacher.

It answers the generated problems of ``stillroom.sources`` from their structured form with a worked
solution inside ``<think>…</think>`` and a boxed final answer, and the project's kernel problems with a
plan and the problem's reference Triton solution in a code block. Effort levels map to how much of the
reasoning it writes (clearly different lengths), and with probability ``error_rate`` (per effort,
optionally) it slips — a wrong intermediate result carried to a wrong final answer; for a kernel, torch
code that is right but is not Triton (the rule reward's case) or a kernel that stores a wrong value — so
grading has something to reject. Deterministic in (seed, prompt id, effort, sample index).
"""

from __future__ import annotations

import ast
import random
import re
from collections.abc import Mapping
from typing import Any

from ..io import DataError
from ..sources import LETTERS, by_detail, worked_solution
from . import Completion, Teacher

DEFAULT_DETAIL = {"low": 0, "medium": 1, "high": 2, "xhigh": 3}


class ProceduralTeacher(Teacher):
    def complete(
        self, problem: Mapping[str, Any], effort: str, sample_index: int, seed: int
    ) -> Completion:
        detail = {**DEFAULT_DETAIL, **self.spec.get("detail", {})}
        if effort not in detail:
            raise ValueError(
                f"teacher '{self.name}': no detail level for effort '{effort}' (have {sorted(detail)})"
            )
        meta = problem.get("meta") or {}
        if "op" not in meta and "solution" not in meta:
            raise DataError(
                f"teacher '{self.name}' (procedural) can only answer generated problems and the "
                f"project's kernel problems; prompt {problem.get('prompt_id')} from source "
                f"'{problem.get('source')}' has no meta.op or meta.solution"
            )
        rng = random.Random(f"{seed}:{problem['prompt_id']}:{effort}:{sample_index}")
        rate = self.spec.get("error_rate", 0.0)
        rate = rate.get(effort, 0.0) if isinstance(rate, Mapping) else rate
        slip = rng.random() < rate
        if problem["kind"] == "kernel":
            reasoning, final = kernel_solution(
                problem["prompt"],
                meta["solution"],
                detail[effort],
                rng.choice(["torch", "wrong"]) if slip else None,
            )
        else:
            result: int | str = problem["answer"]
            if slip and problem["kind"] == "choice":
                result = rng.choice([L for L in LETTERS[: len(meta["options"])] if L != result])
            elif slip:
                result = int(result) + rng.choice([-2, -1, 1, 2])
            reasoning, final = worked_solution(meta, result, detail[effort])
        text = f"<think>{reasoning}</think>\n{final}"
        return Completion(
            text=text,
            finish_reason="stop",
            prompt_tokens=len(problem["prompt"].split()),
            completion_tokens=len(text.split()),
            model=f"procedural/{self.name}",
            reasoning=reasoning,
        )


def kernel_solution(
    problem_src: str, solution: str, detail: int, slip: str | None = None
) -> tuple[str, str]:
    """(reasoning, code block) for one of the project's kernel problems; ``slip`` "torch" answers with the
    reference's own torch code (correct, but not Triton), "wrong" scales the first stored value."""
    from ..kernels import SOLUTIONS_DIR

    code = (SOLUTIONS_DIR / f"{solution}.py").read_text(encoding="utf-8")
    problem = ast.parse(problem_src)
    doc = (ast.get_docstring(problem) or "the reference computation").rstrip(".")
    tree = ast.parse(code)
    kernels = [
        f.name
        for f in tree.body
        if isinstance(f, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in f.decorator_list)
    ]
    forward = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "ModelNew"
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == "forward"
    )
    args = ", ".join(a.arg for a in forward.args.args[1:])
    blocks = sorted(
        {
            k.arg
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            for k in node.keywords
            if k.arg and k.arg.isupper()
        }
    )
    names = ", ".join(f"`{k}`" for k in kernels)
    steps = [
        f"Launch {names} from forward over a grid of program blocks"
        + (f" ({', '.join(blocks)} per program)" if blocks else "")
        + "; forward itself only allocates the output.",
        f"The module computes: {doc}. forward takes ({args}), so each program loads its slice with masked "
        "tl.load, computes in registers and writes with a masked tl.store.",
        "Check: lanes past the end are masked, the parameters keep Model's names so the state_dict matches, "
        "and no torch op computes outside the kernels.",
        f"So ModelNew is {len(kernels)} Triton kernel{'s' if len(kernels) > 1 else ''} plus a thin launcher.",
    ]
    if slip == "torch":
        code = (
            re.sub(r"\bModel\b", "ModelNew", problem_src.split("\ndef get_inputs")[0]).rstrip()
            + "\n"
        )
        steps[0] = "PyTorch already has this operation, so forward can call it directly."
    elif slip == "wrong":
        code = re.sub(r"tl\.store\(([^,]+),\s*", r"tl.store(\1, 0.5 * ", code, count=1)
    return by_detail(steps, detail), f"```python\n{code}```"
