"""The static half of the rule reward: what a candidate's source may contain, read from its AST.

A candidate must define a ``@triton.jit`` kernel and launch it (``kernel[grid](...)``) from
``ModelNew.forward`` or a function it calls; kernel bodies use ``triton.language`` only; the
forward path calls no torch compute (only allocation, shape and view operations); nothing may catch
errors
(a fallback to torch), reach the reference ``Model``, compute with numpy, start processes, open
sockets or files, or use dynamic lookups (``getattr``, ``eval``/``exec``, ``importlib``, dunder
introspection) that would hide any of this from the checks. The run-time half (a kernel launch is
recorded, no torch compute outside launches) is in worker.py.
"""

from __future__ import annotations

import ast

ALLOWED_IMPORTS = {
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "triton",
    "triton.language",
    "math",
    "typing",
    "__future__",
    "functools",
    "dataclasses",
}
FORBIDDEN_NAMES = {
    "getattr",
    "setattr",
    "delattr",
    "eval",
    "exec",
    "compile",
    "__import__",
    "globals",
    "locals",
    "vars",
    "open",
    "breakpoint",
    "input",
    "exit",
    "quit",
    "__builtins__",
    "Model",
    "get_inputs",
    "get_init_inputs",
}
FORBIDDEN_ATTRS = {
    "__dict__",
    "__class__",
    "__subclasses__",
    "__globals__",
    "__builtins__",
    "__code__",
    "__closure__",
    "__getattribute__",
    "__bases__",
    "__mro__",
    "__self__",
    "__func__",
}
# torch calls the forward path may make: allocation, shapes, views. Everything else is compute.
ALLOWED_TORCH_CALLS = {
    "empty",
    "empty_like",
    "empty_strided",
    "zeros",
    "zeros_like",
    "device",
    "Size",
    "is_tensor",
    "get_default_dtype",
}
ALLOWED_METHODS = {
    "view",
    "reshape",
    "contiguous",
    "t",
    "transpose",
    "permute",
    "size",
    "stride",
    "numel",
    "dim",
    "unsqueeze",
    "squeeze",
    "expand",
    "flatten",
    "data_ptr",
    "is_contiguous",
    "element_size",
    "new_empty",
    "new_zeros",
    "view_as",
    "reshape_as",
    "expand_as",
    "unbind",
    "chunk",
    "split",
    "append",
    "extend",
    "items",
    "keys",
    "values",
    "parameters",
    "buffers",
    "format",
}
TRITON_HELPERS = {"cdiv", "next_power_of_2", "jit", "autotune", "heuristics", "Config"}
# Names of the libraries a candidate might patch by assigning to their attributes.
LIBRARY_NAMES = {"torch", "triton", "tl", "nn", "F"}


def _decorator_names(fn: ast.FunctionDef) -> set[str]:
    names = set()
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        names.add(ast.unparse(d))
    return names


def _has_call(node: ast.AST) -> bool:
    """A call other than the allowed constants' constructors (tl.constexpr(...), torch.float32 is
    no call)."""
    return any(
        isinstance(n, ast.Call)
        and _dotted(n.func) not in {"tl.constexpr", "triton.language.constexpr"}
        for n in ast.walk(node)
    )


def _is_kernel(fn: ast.AST) -> bool:
    return isinstance(fn, ast.FunctionDef) and bool(_decorator_names(fn) & {"triton.jit", "jit"})


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    # unparse of odd nodes; the name is only used in messages
    except Exception:  # noqa: BLE001
        return type(node).__name__


class _Source:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.kernels = {name for name, fn in self.functions.items() if _is_kernel(fn)}
        self.model = next(
            (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None
        )
        self.methods = {
            n.name: n
            for n in (self.model.body if self.model else [])
            if isinstance(n, ast.FunctionDef)
        }

    def forward_path(self) -> list[ast.FunctionDef]:
        """forward and every module function or ModelNew method it reaches by name (kernels
        excluded)."""
        seen: dict[str, ast.FunctionDef] = {}
        todo = ["self.forward"]
        while todo:
            name = todo.pop()
            fn = (
                self.methods.get(name.removeprefix("self."))
                if name.startswith("self.")
                else self.functions.get(name)
            )
            if fn is None or name in seen or name in self.kernels:
                continue
            seen[name] = fn
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                callee = _dotted(call.func)
                if callee.startswith("self.") or callee in self.functions:
                    todo.append(callee)
        return list(seen.values())


def check(candidate_src: str) -> list[str]:
    """Every rule the candidate breaks, as reasons; an empty list means it passes the static
    rules."""
    try:
        tree = ast.parse(candidate_src)
    except SyntaxError as exc:
        return [f"syntax error: {exc.msg} (line {exc.lineno})"]
    src = _Source(tree)
    reasons: list[str] = []

    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for m in modules:
                if m not in ALLOWED_IMPORTS:
                    reasons.append(
                        f"line {node.lineno}: imports {m} "
                        f"(allowed: {', '.join(sorted(ALLOWED_IMPORTS))})"
                    )
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            reasons.append(f"line {node.lineno}: try/except (a fallback path around the kernel)")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            reasons.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
            reasons.append(f"line {node.lineno}: uses {node.attr}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and _dotted(t).split(".")[0] in LIBRARY_NAMES:
                    reasons.append(f"line {node.lineno}: assigns {_dotted(t)} (patching a library)")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            reasons.append(
                f"line {node.lineno}: global/nonlocal state (results cached across calls)"
            )

    # Only definitions at module and class level: code there runs outside every check (at import).
    for scope in [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for stmt in scope:
            if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) and _has_call(stmt):
                reasons.append(
                    f"line {stmt.lineno}: code at module or class level ({ast.unparse(stmt)[:60]})"
                )
            elif not isinstance(
                stmt,
                (
                    ast.Import,
                    ast.ImportFrom,
                    ast.FunctionDef,
                    ast.ClassDef,
                    ast.Expr,
                    ast.Assign,
                    ast.AnnAssign,
                    ast.Pass,
                ),
            ):
                reasons.append(
                    f"line {stmt.lineno}: {type(stmt).__name__.lower()} statement "
                    "at module or class level"
                )
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        if fn.name.startswith("__") and fn.name != "__init__":
            reasons.append(f"line {fn.lineno}: defines {fn.name} (hooks run outside the checks)")
    if not src.kernels:
        reasons.append("no @triton.jit kernel is defined at module level")
    for name in src.kernels:
        for node in ast.walk(src.functions[name]):
            if isinstance(node, ast.Name) and node.id in {"torch", "nn", "F", "np"}:
                reasons.append(
                    f"kernel {name}, line {node.lineno}: uses {node.id} inside a Triton kernel"
                )
    if src.model is None or "forward" not in src.methods:
        return reasons + ["no class ModelNew with a forward method"]

    launched = False
    for fn in src.forward_path():
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            func = call.func
            if isinstance(func, ast.Subscript) and _dotted(func.value) in src.kernels:
                launched = True
                continue
            callee = _dotted(func)
            root = callee.split(".")[0]
            if root in {"torch", "F", "nn"}:
                if callee.split(".")[-1] not in ALLOWED_TORCH_CALLS:
                    reasons.append(
                        f"{fn.name}, line {call.lineno}: calls {callee} "
                        "(torch compute outside Triton)"
                    )
            elif root == "triton":
                if callee.split(".")[-1] not in TRITON_HELPERS:
                    reasons.append(f"{fn.name}, line {call.lineno}: calls {callee}")
            elif (
                isinstance(func, ast.Attribute)
                and not callee.startswith("self.")
                and callee not in src.functions
            ):
                if func.attr not in ALLOWED_METHODS:
                    reasons.append(
                        f"{fn.name}, line {call.lineno}: calls .{func.attr}() "
                        "(only allocation, shape and view methods outside kernels)"
                    )
            elif isinstance(func, ast.Name) and func.id in src.kernels:
                reasons.append(
                    f"{fn.name}, line {call.lineno}: calls kernel {func.id} without a launch grid"
                )
        for node in ast.walk(fn):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                reasons.append(f"{fn.name}, line {node.lineno}: @ (a torch matmul outside Triton)")
    if not launched:
        reasons.append("ModelNew.forward never launches a @triton.jit kernel (kernel[grid](...))")
    return reasons
