"""KernelBench-style problems checked, and scaled down to an input budget for CPU runs.

KernelBench sizes its problems for a GPU: the median level-1 problem draws about 2 GB of inputs per
trial, and Triton's interpreter runs ~1000x slower than torch. ``scale_problem`` halves the
module-level integer constants that size ``get_inputs()`` (``N = 2048 * 2``, ``dim1 = 4096``,
``input_shape = (32768,)``), the largest first, until the inputs' total element count is within the
budget. Only those assignments are rewritten in the source text (found by the AST, everything else
kept verbatim), so the prompt the model sees and the reference the validator runs are one scaled
problem. Sizes are measured on torch's meta device, which allocates nothing, so a problem is never
materialised at its published size; the scaled problem is then run once for real.

Left alone: constants below ``MIN_SCALED_SIZE`` (16), constants whose halving does not shrink the
inputs (output channels, head counts) or breaks the problem, and constants computed from other
constants (they follow the ones they are computed from). Why 16: KernelBench's kernel sizes,
strides, paddings, dilations and reduction dims are all under 16, and its groups and num_groups
are 8 or 16 (a halved size stays >= 16, so a power-of-two group count up to 16 still divides it);
16 is also tl.dot's smallest tile, so a scaled matmul never forces padded tiles.
"""

from __future__ import annotations

import ast
import types
from dataclasses import dataclass, field
from typing import Any

from ..config.data import MIN_SCALED_SIZE
from ..io import DataError

REQUIRED = ("Model", "get_inputs", "get_init_inputs")
# literal arithmetic this large is not a tensor size
_MAX_LITERAL = 2**62


def check_problem(src: str, where: str) -> ast.Module:
    """The problem's syntax tree; DataError naming ``where`` when it does not parse or does not
    define ``Model``, ``get_inputs`` and ``get_init_inputs`` at module level."""
    try:
        tree = ast.parse(src, filename=where)
    except SyntaxError as exc:
        raise DataError(f"{where}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    bound = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            bound.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            bound.update(a.asname or a.name for a in node.names)
    missing = [name for name in REQUIRED if name not in bound]
    if missing:
        raise DataError(
            f"{where}: a KernelBench-style problem defines class Model, get_inputs() and "
            f"get_init_inputs() at module level; missing: {', '.join(missing)}"
        )
    return tree


@dataclass
class Scaled:
    """A problem within the budget: its source (the original when it already fit), the input
    element counts before and after, and each rewritten constant's original and scaled value
    (``input_shape[0]``: an element of a tuple constant)."""

    src: str
    elements: tuple[int, int]
    constants: dict[str, list[Any]] = field(default_factory=dict)

    def meta(self, budget: int) -> dict[str, Any]:
        return {
            "max_input_elements": budget,
            "input_elements": list(self.elements),
            "constants": self.constants,
        }


@dataclass
class _Size:
    """One integer that may size the inputs: a constant, or one element of a tuple constant."""

    names: tuple[str, ...]  # the constant's names (``height = width = 128`` binds two)
    index: int | None  # its element in a tuple or list constant, else None
    node: ast.expr  # the expression the scaled value replaces
    original: int
    value: int
    frozen: bool = False  # not (or no longer) halved: it does not size the inputs, or breaks them


def scale_problem(src: str, budget: int, where: str) -> Scaled:
    """``src`` with its sizing constants halved until ``get_inputs()`` holds at most ``budget``
    elements, then built and run once; DataError naming ``where`` when no scaling fits, or the
    problem does not run or gives non-finite outputs."""
    tree = check_problem(src, where)
    sizes = _sizes(tree)
    before = _elements(src, where)
    elements = before
    meta_forward = False
    if elements > budget:
        # a forward that runs on the meta device guards each step against shapes that no longer
        # fit together
        meta_forward = _runs_on_meta(src)
        for size in sizes:
            size.frozen = not _is_input_size(src, size, sizes, elements, where)
    while elements > budget:
        open_ = [s for s in sizes if not s.frozen and _halve(s.value) >= MIN_SCALED_SIZE]
        if not open_:
            break
        largest = max(s.value for s in open_)
        group = [s for s in open_ if s.value == largest]
        # equal sizes are halved together first (a square input stays square, a depthwise conv's
        # channels stay equal, a broadcast stays aligned), then one at a time
        for step in [group] + ([[s] for s in group] if len(group) > 1 else []):
            smaller = _try_halving(src, step, sizes, elements, meta_forward, where)
            if smaller is not None:
                elements = smaller
                break
        else:
            for s in group:
                s.frozen = True
    if elements > budget:
        floored = sorted({n for s in sizes if not s.frozen for n in s.names})
        why = (
            f"with the constants that size it ({', '.join(floored)}) at their floor "
            f"({MIN_SCALED_SIZE}: halved no further)"
            if floored
            else "and no module-level integer constant of it sizes the inputs"
        )
        raise DataError(
            f"{where}: cannot scale to max_input_elements {budget}: get_inputs() still gives "
            f"{elements} elements {why}; raise max_input_elements"
        )
    scaled = _rewrite(src, sizes)
    _run(scaled, where)
    constants = {
        name if s.index is None else f"{name}[{s.index}]": [s.original, s.value]
        for s in sizes
        if s.value != s.original
        for name in s.names
    }
    return Scaled(scaled, (before, elements), constants)


def _is_input_size(src: str, size: _Size, sizes: list[_Size], elements: int, where: str) -> bool:
    """Whether halving ``size`` alone changes the inputs' element count (or breaks get_inputs(),
    as when two sizes must stay equal): output channels, head counts and the like do not."""
    old, size.value = size.value, _halve(size.value)
    try:
        return _elements(_rewrite(src, sizes), where) != elements
    except DataError:
        return True
    finally:
        size.value = old


def _try_halving(
    src: str,
    step: list[_Size],
    sizes: list[_Size],
    elements: int,
    meta_forward: bool,
    where: str,
) -> int | None:
    """The inputs' element count with ``step`` halved, kept halved when that shrinks the inputs
    and the problem still builds (and runs on the meta device, if it did at first); else None and
    ``step`` restored."""
    old = [s.value for s in step]
    for s in step:
        s.value = _halve(s.value)
    candidate = _rewrite(src, sizes)
    try:
        smaller = _elements(candidate, where)
    except DataError:
        smaller = None
    if smaller is None or smaller >= elements or (meta_forward and not _runs_on_meta(candidate)):
        for s, value in zip(step, old, strict=True):
            s.value = value
        return None
    return smaller


def _assigned(tree: ast.Module) -> list[tuple[tuple[str, ...], ast.expr]]:
    """Module-level ``NAME = value``, ``A = B = value``, ``A, B = a, b`` and ``NAME: T = value``:
    each value with the names it binds; names bound more than once at module level are left
    out."""
    found: list[tuple[tuple[str, ...], ast.expr]] = []
    seen: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if (
            len(targets) == 1
            and isinstance(targets[0], ast.Tuple)
            and isinstance(value, ast.Tuple)
            and len(targets[0].elts) == len(value.elts)
        ):
            # height, width = 128, 128
            pairs = [([t], v) for t, v in zip(targets[0].elts, value.elts, strict=True)]
        else:
            pairs = [(targets, value)]
        for part_targets, part_value in pairs:
            names = tuple(t.id for t in part_targets if isinstance(t, ast.Name))
            for name in names:
                seen[name] = seen.get(name, 0) + 1
            if len(names) == len(part_targets):
                found.append((names, part_value))
    return [(names, value) for names, value in found if all(seen[n] == 1 for n in names)]


def _sizes(tree: ast.Module) -> list[_Size]:
    """The integers in the file's literal constants that are at least ``MIN_SCALED_SIZE``."""
    out = []
    for names, value in _assigned(tree):
        if isinstance(value, ast.Tuple | ast.List):
            parts = [(i, element) for i, element in enumerate(value.elts)]
        else:
            parts = [(None, value)]
        for index, node in parts:
            number = _literal_int(node)
            if number is not None and number >= MIN_SCALED_SIZE:
                out.append(_Size(names, index, node, number, number))
    return out


def _literal_int(node: ast.expr) -> int | None:
    """The value of integer literal arithmetic (``2048 * 2``, ``131072 * 4``, ``2**12``), or
    None for anything else (names, calls, floats, bools)."""
    if isinstance(node, ast.Constant):
        ok = isinstance(node.value, int) and not isinstance(node.value, bool)
        return node.value if ok else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _literal_int(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp):
        left, right = _literal_int(node.left), _literal_int(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        elif isinstance(node.op, ast.Mult):
            value = left * right
        elif isinstance(node.op, ast.FloorDiv) and right:
            value = left // right
        elif isinstance(node.op, ast.Pow) and 0 <= right < 64 and abs(left) < 2**16:
            value = left**right
        elif isinstance(node.op, ast.LShift) and 0 <= right < 64:
            value = left << right
        else:
            return None
        return value if abs(value) < _MAX_LITERAL else None
    return None


def _halve(value: int) -> int:
    # an odd size stays odd (4095 -> 2047): KernelBench's odd sizes test a kernel's boundary masks
    return value // 2 if value % 2 == 0 else (value // 2) | 1


def _rewrite(src: str, sizes: list[_Size]) -> str:
    """``src`` with each changed size's expression replaced by its value, by position (UTF-8 byte
    columns, as ``ast`` gives them), so comments and layout stay as written."""
    lines = src.split("\n")  # ast counts lines by "\n"; str.splitlines also splits at \f and more
    changed = sorted(
        (s for s in sizes if s.value != s.original),
        key=lambda s: (s.node.lineno, s.node.col_offset),
        reverse=True,  # from the end, so earlier positions stay valid
    )
    for s in changed:
        n = s.node
        first, last = n.lineno - 1, n.end_lineno - 1
        head = lines[first].encode()[: n.col_offset]
        tail = lines[last].encode()[n.end_col_offset :]
        lines[first : last + 1] = [(head + str(s.value).encode() + tail).decode()]
    return "\n".join(lines)


def _module(src: str, where: str) -> types.ModuleType:
    module = types.ModuleType("kernel_problem")
    module.__file__ = where
    exec(compile(src, where, "exec"), module.__dict__)  # noqa: S102 - the problem is the reference
    return module


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list | tuple):
        return [t for v in value for t in _flatten(v)]
    return [value]


def _elements(src: str, where: str) -> int:
    """Total elements of the tensors ``get_inputs()`` returns, measured on the meta device."""
    import torch

    try:
        module = _module(src, where)
        with torch.device("meta"):
            inputs = module.get_inputs()
    except Exception as exc:  # noqa: BLE001 - any failure of the problem's own code is its error
        raise DataError(
            f"{where}: get_inputs() fails on torch's meta device, where its sizes are measured "
            f"without allocating them ({type(exc).__name__}: {exc})"
        ) from None
    return sum(t.numel() for t in _flatten(inputs) if isinstance(t, torch.Tensor))


def check_inputs(src: str, where: str) -> None:
    """DataError naming ``where`` when ``get_init_inputs()`` or ``get_inputs()`` raises: run on
    torch's meta device, which allocates nothing (a problem may be sized for a GPU), and for real
    only where the meta device cannot run them. The caller's torch RNG is left as it was."""
    import torch

    try:
        module = _module(src, where)
    except Exception as exc:  # noqa: BLE001 - any failure of the problem's own code is its error
        raise DataError(f"{where}: fails when run ({type(exc).__name__}: {exc})") from None
    for name in ("get_init_inputs", "get_inputs"):
        call = getattr(module, name)
        with torch.random.fork_rng(devices=[]):
            try:
                with torch.device("meta"):
                    call()
            except Exception:  # noqa: BLE001 - what the meta device cannot run is run for real
                try:
                    call()
                except Exception as exc:  # noqa: BLE001 - the problem's own code failing
                    raise DataError(
                        f"{where}: {name}() fails ({type(exc).__name__}: {exc}); the validator "
                        "calls it for every trial"
                    ) from None


def _runs_on_meta(src: str) -> bool:
    """Whether Model(*get_init_inputs()) builds and runs on get_inputs() on the meta device."""
    import torch

    try:
        module = _module(src, "<meta check>")
        with torch.device("meta"), torch.no_grad():
            module.Model(*module.get_init_inputs())(*module.get_inputs())
    except Exception:  # noqa: BLE001 - a problem the meta device cannot run is checked for real
        return False
    return True


def _run(src: str, where: str) -> None:
    """Build ``Model(*get_init_inputs())`` and run it on ``get_inputs()`` at the sizes kept (the
    validator's first step): outputs must be finite. The caller's torch RNG is left as it was."""
    import torch

    try:
        module = _module(src, where)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(0)
            out = module.Model(*module.get_init_inputs())(*module.get_inputs())
    except Exception as exc:  # noqa: BLE001 - any failure of the problem's own code is its error
        raise DataError(
            f"{where}: Model(*get_init_inputs())(*get_inputs()) fails at the sizes kept "
            f"({type(exc).__name__}: {exc})"
        ) from None
    for i, t in enumerate(_flatten(out)):
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(t.isfinite().all()):
            raise DataError(
                f"{where}: output {i} has non-finite values at the sizes kept "
                f"({(~t.isfinite()).sum().item()} of {t.numel()}): a reference must be finite"
            )
