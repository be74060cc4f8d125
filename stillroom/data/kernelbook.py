"""KernelBook-style rows as kernel SFT examples, each kept only when the kernel reward grades its
Triton 1 against its own PyTorch module.

A row (GPUMODE/KernelBook, https://huggingface.co/datasets/GPUMODE/KernelBook; the rows as public
loaders read them: ``uuid``, ``entry_point``, ``python_code``, ``triton_code``, ``repo_name``,
``licenses``, ...) pairs a module harvested from GitHub (``python_code``: the class
``entry_point``, ``get_inputs()``, and ``get_init_inputs()`` returning ``[args, kwargs]``) with the
Triton that torch.compile's Inductor (torch 2.5) generated for it (``triton_code``: the kernels,
``call(args)``, and a class ``<entry_point>New`` whose forward calls it). Made into what the
validator grades (``problem`` and ``candidate``):

- the problem is the row's module, with ``Model`` taking the row's ``[args, kwargs]``;
- the candidate is the row's Triton with ``ModelNew`` likewise, and the torch 2.5 host helpers
  its imports name but later torch no longer has (``grid`` of Inductor's heuristics, the raw
  stream) written out; on CPU, its CUDA-only host calls (device guard, ``set_device``, CUDA
  allocation) made the CPU's.

The candidate is also the answer the example teaches: what the reward graded, so what GRPO grades
later. A row that does not earn 1 is dropped with the reward's reasons; a file whose rows lack a
column or hold no text there is refused, naming the file, row and column.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..config import ValidatorOptions
from ..config.data import KernelBookSource
from ..grading.formats import kernel_instruction
from ..ids import prompt_id
from ..io import DataError, iter_lines, parse_row
from ..provenance.sidecars import Notes
from .sources import load_table

# torch 2.5's torch/_inductor/runtime/triton_heuristics.py ``grid`` (removed from later torch),
# which KernelBook's rows import: a launch grid over (x), (y, x) or (z, y, x) element counts, each
# divided by the launch's XBLOCK, YBLOCK, ZBLOCK (y split over z past CUDA's y limit).
GRID = """
def grid(*numels):
    xnumel, ynumel, znumel = (list(reversed(numels)) + [None, None])[:3]

    def dim(numel, block):
        if numel is None:
            return 1
        return numel if block is None else -(-numel // block)

    def grid_fn(meta):
        y = dim(ynumel, meta.get("YBLOCK"))
        if znumel is None:
            split = -(-y // 65535)
            return (dim(xnumel, meta.get("XBLOCK", 1)), -(-y // split), split)
        return (dim(xnumel, meta.get("XBLOCK", 1)), y, dim(znumel, meta.get("ZBLOCK")))

    return grid_fn
"""
# the raw CUDA stream Inductor's wrapper fetches before each launch; unused by the launch itself
RAW_STREAM = "def get_raw_stream(index):\n    return 0\n"
EMPTY_STRIDED = (
    "def {name}(size, stride, dtype):\n"
    "    return torch.empty_strided(size, stride, dtype=dtype, device={device!r})\n"
)
INIT = (
    "\n\nclass {cls}({base}):\n"
    "    # the row's get_init_inputs() gives [args, kwargs]\n"
    "    def __init__(self, args=(), kwargs=None):\n"
    "        super().__init__(*args, **(kwargs or {{}}))\n"
)


def problem(row: Mapping[str, str]) -> str:
    """The validator's problem: the row's module as ``Model``."""
    return row["python_code"].rstrip() + INIT.format(cls="Model", base=row["entry_point"])


def candidate(row: Mapping[str, str], device: str) -> str:
    """The validator's candidate, and the example's answer: the row's Triton as ``ModelNew``."""
    tree = ast.parse(row["triton_code"])
    tree.body = [s for node in tree.body for s in _host(node, device)]
    code = ast.unparse(ast.fix_missing_locations(tree))
    return code + INIT.format(cls="ModelNew", base=f"{row['entry_point']}New")


def _host(node: ast.stmt, device: str) -> list[ast.stmt]:
    """``node`` as the candidate holds it: the statements it becomes."""
    if isinstance(node, ast.ImportFrom) and node.module in (
        "torch._inductor.runtime.triton_heuristics",
        "torch._C",
    ):
        kept = [a for a in node.names if (a.asname or a.name) not in ("grid", "get_raw_stream")]
        made = [
            ast.parse(GRID if (a.asname or a.name) == "grid" else RAW_STREAM).body[0]
            for a in node.names
            if a not in kept
        ]
        return ([ast.ImportFrom(node.module, kept, node.level)] if kept else []) + made
    target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
    if (
        isinstance(target, ast.Name)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "_empty_strided_cuda"
    ):
        allocate = EMPTY_STRIDED.format(name=target.id, device=device.split(":")[0])
        return ast.parse(allocate).body
    if isinstance(node, ast.FunctionDef | ast.With):
        if (
            device == "cpu"
            and isinstance(node, ast.With)
            and _cuda_call(node.items[0].context_expr)
        ):
            return [s for child in node.body for s in _host(child, device)]
        node.body = [s for child in node.body for s in _host(child, device)] or [ast.Pass()]
        return [node]
    if device == "cpu" and isinstance(node, ast.Expr) and _cuda_call(node.value):
        return []
    return [node]


def _cuda_call(expr: ast.expr) -> bool:
    """``torch.cuda.<anything>(...)``: the device guard and ``set_device`` of Inductor's wrapper."""
    return isinstance(expr, ast.Call) and ast.unparse(expr.func).startswith("torch.cuda.")


def rows(
    spec: KernelBookSource, notes: Notes | None = None
) -> Iterator[tuple[str, dict[str, str]]]:
    """(where, row) for each row of the source, up to its ``limit``: the columns it needs, each
    checked to hold text. A file that cannot be read, or a row without one of them, is an error
    naming the file, row and column. ``notes`` gets the file or hub dataset read (None: not
    kept)."""
    cols = spec.columns
    need = {
        "id": cols.id,
        "entry_point": cols.entry_point,
        "python_code": cols.python_code,
        "triton_code": cols.triton_code,
        **({"reasoning": cols.reasoning} if cols.reasoning else {}),
    }
    for n, (where, raw) in enumerate(_raw_rows(spec, Notes() if notes is None else notes)):
        if spec.limit and n >= spec.limit:
            return
        row = {}
        for key, column in need.items():
            value = raw.get(column)
            if key == "id" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                raise DataError(
                    f"source '{spec.name}': {where}: column '{column}' ({key}) should be "
                    f"non-empty text, got {value!r:.60}"
                )
            row[key] = value
        if not row["entry_point"].isidentifier():
            raise DataError(
                f"source '{spec.name}': {where}: column '{cols.entry_point}' should name a class, "
                f"got {row['entry_point']!r:.60}"
            )
        yield where, row


def _raw_rows(spec: KernelBookSource, notes: Notes) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if spec.path.endswith(".jsonl"):
        notes.add_file(spec.path)
        # our reader: a torn or undecodable line is named by its line number
        for lineno, line in iter_lines(spec.path):
            yield f"{spec.path}:{lineno}", parse_row(spec.path, lineno, line)
        return
    ds = load_table(
        spec.name,
        spec.path,
        local=spec.local,
        split=spec.split,
        revision=spec.revision,
        role=f"sft_source:{spec.name}",
        notes=notes,
    )
    for i, row in enumerate(ds):
        yield f"{spec.path} row {i}", row


def example(spec: KernelBookSource, where: str, row: Mapping[str, str], answer: str, effort: str):
    """The SFT example of a kept row: the instruction GRPO and evaluation ask with, and the
    graded candidate (after the row's reasoning, when it has some) as the answer."""
    prompt = problem(row)
    code = f"```python\n{answer.rstrip()}\n```"
    response = f"<think>{row['reasoning'].strip()}</think>\n{code}" if "reasoning" in row else code
    return {
        "id": f"{spec.name}:{row['id']}",
        "prompt_id": prompt_id(prompt, spec.name),
        "effort": effort,
        "tagged": False,
        "messages": [
            {"role": "user", "content": kernel_instruction(prompt)},
            {"role": "assistant", "content": response},
        ],
        "completion_tokens": len(response.split()),
        "source_record": {"file": spec.path, "row": where, "id": row["id"]},
    }


def grade(
    spec: KernelBookSource,
    options: ValidatorOptions,
    effort: str,
    seed: int = 0,
    threads: int = 1,
    notes: Notes | None = None,
) -> tuple[list[dict], dict[str, Any]]:
    """(the examples of the rows that earn 1, the report: every row's outcome and the counts).
    Every row is graded; none is dropped without its reasons. ``notes``: as ``rows``."""
    from ..kernels import evaluate

    listed = list(rows(spec, notes))
    if not listed:
        raise DataError(f"source '{spec.name}': {spec.path} has no rows")
    settings = {**options.dump(), "cases": list(spec.cases)}

    def one(item: tuple[str, dict[str, str]]) -> tuple[str, Any]:
        where, row = item
        try:
            answer = candidate(row, options.device)
        except SyntaxError as exc:  # the row's text, not the reward: its reason, no grading
            return "", f"its Triton does not parse ({exc.msg}, line {exc.lineno})"
        return answer, evaluate(problem(row), answer, seed=seed, **settings)

    with ThreadPoolExecutor(max(1, threads)) as pool:
        graded = list(pool.map(one, listed))
    kept, outcomes, reasons = [], [], Counter()
    for (where, row), (answer, result) in zip(listed, graded, strict=True):
        why = [result] if isinstance(result, str) else result.reasons
        ok = not isinstance(result, str) and result.reward == 1.0
        outcomes.append(
            {"row": where, "id": row["id"], "entry_point": row["entry_point"], "kept": ok}
            | ({} if ok else {"reasons": why, "status": getattr(result, "status", "refused")})
        )
        if ok:
            kept.append(example(spec, where, row, answer, effort))
        else:
            reasons[_category(why)] += 1
    report = {
        "source": spec.name,
        "path": spec.path,
        "revision": spec.revision,
        "rows": len(listed),
        "kept": len(kept),
        "dropped": len(listed) - len(kept),
        "accepted_share": round(len(kept) / len(listed), 4),
        "dropped_by_reason": dict(reasons.most_common()),
        "outcomes": outcomes,
    }
    return kept, report


def _category(reasons: list[str]) -> str:
    """A dropped row's first reason without its case and numbers: rows that fail alike count
    together."""
    first = reasons[0] if reasons else "no reason given"
    head = first.split(": ", 1)[1] if first.startswith(("trial ", "case ")) else first
    return "".join("N" if c.isdigit() else c for c in head)[:160]
