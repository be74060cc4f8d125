"""The procedural teacher's answers to the project's kernel problems: a plan at the effort's
detail, then the problem's reference Triton solution; or a slip (torch code that is right but not
Triton, or a kernel that stores a wrong value)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..data.sources import by_detail
from ..kernels.problemset import reference_solution


def kernel_solution(
    problem_src: str,
    solution: str,
    detail: int,
    slip: str | None = None,
    *,
    family: str | None = None,
    note: Callable[[Path], Any] = lambda path: None,
) -> tuple[str, str]:
    """(reasoning, code block) for one of the project's kernel problems (or of a generated
    ``family``); ``slip`` "torch" answers with the reference's own torch code (correct, but not
    Triton), "wrong" scales the first stored value. ``note`` gets the solution file read, as
    ``reference_solution`` gives it."""
    code = reference_solution(solution, family, note=note)
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
        f"The module computes: {doc}. forward takes ({args}), so each program loads its slice "
        "with masked tl.load, computes in registers and writes with a masked tl.store.",
        "Check: lanes past the end are masked, the parameters keep Model's names so the "
        "state_dict matches, and no torch op computes outside the kernels.",
        f"So ModelNew is {len(kernels)} Triton kernel{'s' if len(kernels) > 1 else ''} "
        "plus a thin launcher.",
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
