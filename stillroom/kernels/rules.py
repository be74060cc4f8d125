"""The static half of the rule reward: what a candidate's source may contain, read from its AST.

A candidate must define a ``@triton.jit`` kernel and launch it (``kernel[grid](...)``) from
``ModelNew.forward`` or a function it calls; kernel bodies call only ``triton.language`` (under any
alias), other ``@triton.jit`` functions and a few builtins, and read no other module-level name
than those and numeric constants (under Triton's interpreter a kernel body is plain Python, so a
helper or a torch alias called from it would compute on the CPU); the forward path calls no torch
compute under any alias (only allocation, shape and view operations, and scalar ``math``); nothing
may catch errors (a fallback to torch), reach the reference ``Model``, compute with numpy, start
processes, open sockets or files, use dynamic lookups (``getattr``, ``eval``/``exec``,
``importlib``, dunder introspection), or walk from an allowed module to the interpreter's internals
(``torch.sys``, ``typing.sys``, private ``_`` attributes, frames) that would hide any of this from
the checks. The run-time half (a kernel launch is recorded, no torch compute but Triton's own) is in
worker.py.

``launch_rules`` is AutoTriton's rule reward proper (the seed's ``validate_syntax``), checked in the
parent on the launches the worker recorded: block sizes, num_warps, an instruction estimate and
coalesced memory access.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import types

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
# What a kernel body may call besides triton.language and the module's @triton.jit functions.
KERNEL_BUILTINS = {"range", "min", "max", "int", "float", "bool", "len", "abs"}
# Methods of a Triton tensor (dir(triton.language.tensor)): the only calls on a kernel's values.
TENSOR_METHODS = {
    "T", "abs", "advance", "argmax", "argmin", "associative_scan", "atomic_add", "atomic_and",
    "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_xchg", "atomic_xor",
    "broadcast_to", "cast", "cdiv", "ceil", "cos", "cumprod", "cumsum", "erf", "exp", "exp2",
    "expand_dims", "flip", "floor", "gather", "histogram", "log", "log2", "logical_and",
    "logical_or", "max", "min", "permute", "ravel", "reduce", "reshape", "rsqrt", "sigmoid", "sin",
    "softmax", "sort", "split", "sqrt", "sqrt_rn", "store", "sum", "to", "trans", "view",
    "xor_sum",
}  # fmt: skip
# Attribute names that lead from an allowed module or object to the interpreter's internals: the
# standard library's modules (torch.sys, typing.sys, dataclasses.inspect, torch.os ...), sys's
# module table, frames and code (a generator's gi_frame.f_back.f_globals is the caller's module),
# and torch.overrides (which can switch the run-time audit off). Tensor methods that share a
# module's name (x.select, x.copy) are left to the other checks.
PATH_ATTRS = (
    set(sys.stdlib_module_names) - ALLOWED_IMPORTS - {"select", "copy", "random", "array", "signal"}
) | {
    "modules",
    "overrides",
    "f_back",
    "f_globals",
    "f_locals",
    "f_builtins",
    "f_code",
    "gi_frame",
    "gi_code",
    "cr_frame",
    "ag_frame",
    "tb_frame",
    "tb_next",
    # the standard library (and numpy) re-exported under other names by torch's public modules
    "np",
    "mp",
    "dill",
    "copymodule",
    "stdlib_re",
    "reducer",
    "reduction",
    "itl",
    "container_abcs",
    "python_multiprocessing",
}
# Where a chain of attributes of an imported module may lead (checked on the real modules).
ALLOWED_PACKAGES = {m.split(".")[0] for m in ALLOWED_IMPORTS}
BLOCK_NAME = re.compile(r"(BLOCK|TILE)(_\w+)?|\w*_?(BLOCK|TILE)")


def _has_call(node: ast.AST) -> bool:
    """A call other than the allowed constants' constructors (tl.constexpr(...), torch.float32 is
    no call)."""
    return any(
        isinstance(n, ast.Call)
        and _dotted(n.func) not in {"tl.constexpr", "triton.language.constexpr"}
        for n in ast.walk(node)
    )


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    # unparse of odd nodes; the name is only used in messages
    except Exception:  # noqa: BLE001
        return type(node).__name__


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Every name an import binds, anywhere in the source, to the dotted path it stands for:
    ``import torch.nn.functional as G`` binds G to torch.nn.functional, ``from triton import
    language as L`` binds L to triton.language, ``import torch.nn`` binds torch to torch."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                names[a.asname or top] = a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


class _Source:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.aliases = _aliases(tree)
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.kernels = {name for name, fn in self.functions.items() if self._is_kernel(fn)}
        self.model = next(
            (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None
        )
        self.methods = {
            n.name: n
            for n in (self.model.body if self.model else [])
            if isinstance(n, ast.FunctionDef)
        }
        # module-level names bound to a plain number (or tl.constexpr of one): kernels may read them
        self.constants: dict[str, object] = {}
        for stmt in tree.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                value = stmt.value
                if isinstance(value, ast.Call) and self.resolve(value.func) == (
                    "triton.language.constexpr"
                ):
                    value = value.args[0] if len(value.args) == 1 else None
                number = _literal(value)
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name) and number is not None:
                        self.constants[t.id] = number

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted path a name or attribute chain rooted at an import stands for, or None."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in self.aliases:
            return None
        return ".".join([self.aliases[node.id], *reversed(parts)])

    def _is_kernel(self, fn: ast.FunctionDef) -> bool:
        """Decorated with triton.jit, under whatever name it was imported."""
        return any(
            self.resolve(d.func if isinstance(d, ast.Call) else d) == "triton.jit"
            for d in fn.decorator_list
        )

    def forward_path(self) -> list[ast.FunctionDef]:
        """forward and every module function or ModelNew method it reaches by name, called or
        handed on (``act = helper; act(x)``), kernels excluded."""
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
            for node in ast.walk(fn):
                if isinstance(node, (ast.Name, ast.Attribute)):
                    ref = _dotted(node)
                    if ref.startswith("self.") or ref in self.functions:
                        todo.append(ref)
        return list(seen.values())


def _literal(node: ast.AST | None) -> object | None:
    """The number a constant expression (-1, 2.0, 1 << 10) stands for, or None."""
    if node is None:
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.LShift, ast.Pow)):
            left, right = _literal(node.left), _literal(node.right)
            if isinstance(left, int) and isinstance(right, int) and 0 <= right <= 64:
                return left << right if isinstance(node.op, ast.LShift) else left**right
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _locals(fn: ast.FunctionDef) -> set[str]:
    """Names a function binds itself: parameters, assignment and loop targets."""
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
    return names


def _kernel_reasons(src: _Source, name: str) -> list[str]:
    """What a @triton.jit function's body does beyond Triton: every call resolves to
    triton.language, another @triton.jit function of the module or KERNEL_BUILTINS (methods only
    on the kernel's own values, named as Triton tensor methods), and every module-level name it
    reads is one of those, an import of triton.language or a numeric constant."""
    fn = src.functions[name]
    local = _locals(fn)
    reasons = []

    def where(node: ast.AST) -> str:
        return f"kernel {name}, line {node.lineno}"

    def triton_language(node: ast.AST) -> bool:
        path = src.resolve(node)
        return path is not None and (
            path == "triton.language" or path.startswith("triton.language.")
        )

    body = [n for part in (*fn.body, fn.args) for n in ast.walk(part)]  # not the decorators
    callees = {id(n.func) for n in body if isinstance(n, ast.Call)}  # reported as calls
    for node in body:
        if isinstance(node, (ast.Lambda, ast.FunctionDef, ast.ClassDef)):
            reasons.append(f"{where(node)}: defines a function or class inside a Triton kernel")
        elif isinstance(node, ast.Call):
            func = node.func
            if triton_language(func):
                continue
            if isinstance(func, ast.Name):
                if func.id in src.kernels or (
                    func.id in KERNEL_BUILTINS and func.id not in local | set(src.aliases)
                ):
                    continue
            elif (
                isinstance(func, ast.Attribute)
                and func.attr in TENSOR_METHODS
                and src.resolve(func) is None
                and not (isinstance(func.value, ast.Name) and func.value.id not in local)
                and not isinstance(func.value, ast.Subscript)
            ):
                continue  # x.to(...), tl.load(...).to(...): a method of a kernel value
            reasons.append(
                f"{where(node)}: calls {_dotted(func)} (a kernel may call only triton.language, "
                f"@triton.jit functions and {', '.join(sorted(KERNEL_BUILTINS))})"
            )
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            n = node.id
            if id(node) in callees:
                continue
            if n in local or n in src.kernels or n in src.constants or n in KERNEL_BUILTINS:
                continue
            if n in {"True", "False", "None"} or triton_language(node):
                continue
            if src.aliases.get(n) == "triton":  # triton.language.x, resolved at the attribute
                continue
            reasons.append(
                f"{where(node)}: uses {n} inside a Triton kernel (only triton.language, "
                "@triton.jit functions and numeric constants of the module)"
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if src.aliases.get(node.value.id) == "triton" and not triton_language(node):
                # only triton.language.x reads below the triton package
                if not any(isinstance(p, ast.Attribute) and p.value is node for p in body):
                    reasons.append(f"{where(node)}: uses {_dotted(node)} inside a Triton kernel")
    return list(dict.fromkeys(reasons))


def _path_reasons(src: _Source, tree: ast.Module) -> list[str]:
    """Attribute chains that leave the allowed modules: a name of PATH_ATTRS, a private attribute
    of anything but ``self`` (``super().__init__`` aside), or a chain rooted at an import that,
    walked on the real modules, reaches a module outside the allowed packages."""
    reasons = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr, base = node.attr, node.value
        if attr in FORBIDDEN_ATTRS:
            continue  # reported as "uses"
        if attr in PATH_ATTRS:
            reasons.append(
                f"line {node.lineno}: uses {_dotted(node)} (.{attr} leads to the interpreter's "
                "internals)"
            )
        elif attr.startswith("_") and attr != "__init__" and _dotted(base) != "self":
            reasons.append(
                f"line {node.lineno}: uses {_dotted(node)} (a private attribute of a library)"
            )
        else:
            path = src.resolve(node)
            reached = _module_reached(path) if path else None
            if reached:
                reasons.append(
                    f"line {node.lineno}: uses {_dotted(node)} (the module {reached}, outside "
                    f"{', '.join(sorted(ALLOWED_PACKAGES))})"
                )
    return reasons


def _module_reached(path: str) -> str | None:
    """The name of the module outside ALLOWED_PACKAGES that ``path`` (torch.sys, typing.sys) is,
    or None. Only modules are walked: attribute reads on modules run no candidate code."""
    root, *rest = path.split(".")
    if root not in ALLOWED_PACKAGES:
        return None
    try:
        value = importlib.import_module(root)
    except ImportError:
        return None
    for part in rest:
        if not isinstance(value, types.ModuleType):
            return None
        try:
            value = getattr(value, part)
        except Exception:  # noqa: BLE001 - a missing or lazy attribute: nothing reached
            return None
    if isinstance(value, types.ModuleType):
        package = value.__name__.split(".")[0]
        if package not in ALLOWED_PACKAGES:
            return value.__name__
    return None


def _torch_compute(path: str) -> bool:
    """Whether ``path`` (torch.relu, torch.nn.functional.gelu) names a torch function other than
    ALLOWED_TORCH_CALLS: handed on rather than called (``f = torch.relu``, ``map(G.gelu, xs)``),
    it computes where the call checks do not look. Read on the real module, as _module_reached."""
    root, *rest = path.split(".")
    if root != "torch" or not rest or rest[-1] in ALLOWED_TORCH_CALLS:
        return False
    value = importlib.import_module("torch")
    for part in rest:
        if not isinstance(value, (types.ModuleType, type)):  # torch.Tensor.relu too
            return False
        try:
            value = getattr(value, part)
        except Exception:  # noqa: BLE001 - a missing or lazy attribute: nothing named
            return False
    return isinstance(value, (types.FunctionType, types.BuiltinFunctionType)) or (
        callable(value) and not isinstance(value, (type, types.ModuleType))
    )


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
                root = _dotted(t).split(".")[0]
                if isinstance(t, ast.Attribute) and (root in LIBRARY_NAMES or root in src.aliases):
                    reasons.append(f"line {node.lineno}: assigns {_dotted(t)} (patching a library)")
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            reasons.append(
                f"line {node.lineno}: global/nonlocal state (results cached across calls)"
            )
    reasons += _path_reasons(src, tree)

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
    for name in sorted(src.kernels):
        reasons += _kernel_reasons(src, name)
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
            path = src.resolve(func) or ""
            package = path.split(".")[0]
            if package == "torch":
                if path.split(".")[-1] not in ALLOWED_TORCH_CALLS:
                    reasons.append(
                        f"{fn.name}, line {call.lineno}: calls {callee}"
                        + (f" ({path})" if path != callee else "")
                        + " (torch compute outside Triton)"
                    )
            elif package == "triton":
                if path.split(".")[-1] not in TRITON_HELPERS:
                    reasons.append(f"{fn.name}, line {call.lineno}: calls {callee}")
            elif package == "math":
                continue  # scalar math on Python numbers; on a tensor the run-time audit sees it
            elif (
                isinstance(func, ast.Attribute)
                and _dotted(func.value) == "self"
                and func.attr not in src.methods
            ):
                reasons.append(
                    f"{fn.name}, line {call.lineno}: calls {callee} (a submodule or stored "
                    "callable: torch compute outside Triton)"
                )
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
        callees = {id(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and id(node) not in callees:
                path = src.resolve(node) or ""
                if _torch_compute(path):
                    reasons.append(
                        f"{fn.name}, line {node.lineno}: refers to {_dotted(node)} ({path}: "
                        "torch compute outside Triton, called elsewhere)"
                    )
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                reasons.append(f"{fn.name}, line {node.lineno}: @ (a torch matmul outside Triton)")
    if not launched:
        reasons.append("ModelNew.forward never launches a @triton.jit kernel (kernel[grid](...))")
    return reasons


def launch_rules(
    candidate_src: str,
    records: list[dict],
    *,
    max_block_size: int,
    max_threads_per_block: int,
    max_instructions: int,
) -> list[str]:
    """AutoTriton's rule reward on each recorded launch (worker._launch_record: kernel name,
    constexpr and int arguments, num_warps), as reasons; empty when every launch keeps them.

    - Block sizes: an int constexpr argument is a block size when its name is BLOCK/TILE-like
      (BLOCK, BLOCK_M, BLOCK_SIZE_N, TILE_K, XBLOCK, ROW_BLOCK) or it is the end of a tl.arange in
      the kernel. Each must be a power of two and at most ``max_block_size``.
    - Threads: num_warps x 32 at most ``max_threads_per_block``.
    - Instructions: ``_instructions`` (a static estimate, loops over constant ranges unrolled) at
      most ``max_instructions``.
    - Coalescing: ``_coalesced`` for every tl.load and tl.store of the kernel.
    """
    try:
        src = _Source(ast.parse(candidate_src))
    except SyntaxError:
        return []  # check() reports it
    reasons: list[str] = []
    for record in records:
        name, constexprs = record["kernel"], record["constexprs"]
        fn = src.functions.get(name)
        bounds = _arange_bounds(src, fn) if fn is not None else set()
        for arg, value in sorted(constexprs.items()):
            if not isinstance(value, int) or isinstance(value, bool):
                continue
            if not (BLOCK_NAME.fullmatch(arg) or arg in bounds):
                continue
            if value < 1 or value & (value - 1):
                reasons.append(f"kernel {name}: block size {arg}={value} is not a power of two")
            elif value > max_block_size:
                reasons.append(f"kernel {name}: block size {arg}={value} exceeds {max_block_size}")
        warps = record["num_warps"]
        if warps * 32 > max_threads_per_block:
            reasons.append(
                f"kernel {name}: num_warps={warps} is {warps * 32} threads per block, "
                f"more than {max_threads_per_block}"
            )
        if fn is None:
            continue
        env = {**src.constants, **constexprs}
        count = _instructions(src, fn, env, set())
        if count > max_instructions:
            reasons.append(
                f"kernel {name}: about {count} instructions (static estimate, loops unrolled), "
                f"more than {max_instructions}"
            )
        ones = {k for k, v in {**record["ints"], **constexprs}.items() if v == 1}
        reasons += _coalescing_reasons(src, fn, ones)
    return list(dict.fromkeys(reasons))


def _arange_bounds(src: _Source, fn: ast.FunctionDef) -> set[str]:
    """Parameter names used as the end of a tl.arange in ``fn``."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and src.resolve(node.func) == "triton.language.arange":
            end = node.args[1] if len(node.args) > 1 else None
            end = next((k.value for k in node.keywords if k.arg == "end"), end)
            if isinstance(end, ast.Name):
                names.add(end.id)
    return names


def _value(node: ast.AST, env: dict) -> int | None:
    """An int expression over constants and constexpr values, or None."""
    if isinstance(node, ast.Name):
        value = env.get(node.id)
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, env), _value(node.right, env)
        if left is None or right is None:
            return None
        ops = {ast.Add: int.__add__, ast.Sub: int.__sub__, ast.Mult: int.__mul__}
        if type(node.op) in ops:
            return ops[type(node.op)](left, right)
        if isinstance(node.op, ast.FloorDiv) and right:
            return left // right
        return None
    value = _literal(node)
    return value if isinstance(value, int) else None


def _trip_count(src: _Source, loop: ast.For, env: dict) -> int:
    """How often a for loop over range/tl.range/tl.static_range with known bounds runs; 1 when
    the bounds are only known at run time (the loop stays a loop)."""
    it = loop.iter
    if not isinstance(it, ast.Call) or not (
        (isinstance(it.func, ast.Name) and it.func.id == "range")
        or src.resolve(it.func) in {"triton.language.range", "triton.language.static_range"}
    ):
        return 1
    bounds = [_value(a, env) for a in it.args]
    if not bounds or len(bounds) > 3 or any(b is None for b in bounds) or bounds[-1:] == [0]:
        return 1
    return max(len(range(*bounds)), 1) if len(bounds) < 3 or bounds[2] else 1


def _instructions(src: _Source, fn: ast.FunctionDef, env: dict, stack: set[str]) -> int:
    """A static instruction estimate of a kernel: one per call (a tl op) and per arithmetic,
    comparison or boolean operation, the body of a loop over a known range counted once per
    iteration, both branches of an if, and a called @triton.jit function's own estimate (its
    constexprs unknown) at each call site."""

    def expr(node: ast.AST) -> int:
        total = 0
        for n in ast.walk(node):
            if isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp)):
                total += 1
            elif isinstance(n, ast.Call):
                total += 1
                callee = n.func.id if isinstance(n.func, ast.Name) else None
                if callee in src.kernels and callee not in stack:
                    total += _instructions(
                        src, src.functions[callee], dict(src.constants), stack | {fn.name}
                    )
        return total

    def block(stmts: list[ast.stmt]) -> int:
        total = 0
        for stmt in stmts:
            if isinstance(stmt, ast.For):
                total += expr(stmt.iter) + _trip_count(src, stmt, env) * block(stmt.body)
                total += block(stmt.orelse)
            elif isinstance(stmt, (ast.While, ast.If)):
                total += expr(stmt.test) + block(stmt.body) + block(stmt.orelse)
            elif isinstance(stmt, ast.With):
                total += sum(expr(i) for i in stmt.items) + block(stmt.body)
            else:
                total += expr(stmt)
        return total

    return block(fn.body)


def _coalescing_reasons(src: _Source, fn: ast.FunctionDef, ones: set[str]) -> list[str]:
    """Coalesced access, per tl.load/tl.store of ``fn``: the pointer's offsets, with the kernel's
    local variables substituted, are split into additive terms (through +, -, broadcasting
    subscripts like ``r[:, None]``, tl.multiple_of/max_contiguous, .to, and % or // by a value
    without a tl.arange, after which consecutive lanes read the same or the next address); a term
    holding a tl.arange keeps unit stride unless it is multiplied (by anything but a literal 1 or
    an argument recorded as 1 at this launch), divided by a tl.arange, or passed through another
    call. An access passes when its offsets hold no tl.arange (a scalar) or at least one term
    with a tl.arange at unit stride: some axis of the block walks consecutive addresses. A block
    pointer (tl.make_block_ptr, possibly tl.advance'd) passes when one of its strides is 1."""
    defs: dict[str, list[ast.expr]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    defs.setdefault(t.id, []).append(node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            defs.setdefault(node.target.id, []).append(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            defs.setdefault(node.target.id, []).append(node.value)

    def is_one(node: ast.AST) -> bool:
        return _literal(node) == 1 or (isinstance(node, ast.Name) and node.id in ones)

    def terms(node: ast.AST, seen: frozenset) -> list[bool]:
        """One flag per additive term holding a tl.arange: True when at unit stride."""
        if isinstance(node, ast.Name):
            if node.id in seen:
                return []
            return [t for d in defs.get(node.id, []) for t in terms(d, seen | {node.id})]
        if isinstance(node, ast.Subscript):
            return terms(node.value, seen)
        if isinstance(node, ast.UnaryOp):
            return terms(node.operand, seen)
        if isinstance(node, ast.IfExp):
            return terms(node.body, seen) + terms(node.orelse, seen)
        if isinstance(node, ast.BinOp):
            left, right = terms(node.left, seen), terms(node.right, seen)
            if isinstance(node.op, (ast.Add, ast.Sub)):
                return left + right
            if isinstance(node.op, ast.Mult) and is_one(node.right):
                return left
            if isinstance(node.op, ast.Mult) and is_one(node.left):
                return right
            if isinstance(node.op, (ast.Mod, ast.FloorDiv)) and not right:
                return left  # consecutive lanes read the same or the next address
            return [False] * len(left + right)
        if isinstance(node, ast.Call):
            path = src.resolve(node.func) or ""
            if path == "triton.language.arange":
                return [True]
            passthrough = {"triton.language.multiple_of", "triton.language.max_contiguous"}
            if path in passthrough and node.args:
                return terms(node.args[0], seen)
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to" and not path:
                return terms(node.func.value, seen)
            inner = [
                t for a in [*node.args, *(k.value for k in node.keywords)] for t in terms(a, seen)
            ]
            return [False] * len(inner)
        return []

    def block_pointer(node: ast.AST, seen: frozenset) -> ast.Call | None:
        if isinstance(node, ast.Name) and node.id not in seen:
            for d in defs.get(node.id, []):
                found = block_pointer(d, seen | {node.id})
                if found is not None:
                    return found
        if isinstance(node, ast.Call):
            path = src.resolve(node.func)
            if path == "triton.language.make_block_ptr":
                return node
            if path == "triton.language.advance" and node.args:
                return block_pointer(node.args[0], seen)
        return None

    reasons = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        op = src.resolve(node.func)
        if op not in {"triton.language.load", "triton.language.store"}:
            continue
        pointer = (
            node.args[0]
            if node.args
            else next((k.value for k in node.keywords if k.arg == "pointer"), None)
        )
        if pointer is None:
            continue
        where = f"kernel {fn.name}, line {node.lineno}: tl.{op.rsplit('.', 1)[1]}"
        made = block_pointer(pointer, frozenset())
        if made is not None:
            strides = (
                made.args[2]
                if len(made.args) > 2
                else next((k.value for k in made.keywords if k.arg == "strides"), None)
            )
            if not (isinstance(strides, (ast.Tuple, ast.List)) and any(map(is_one, strides.elts))):
                reasons.append(f"{where} uses a block pointer with no stride 1 (uncoalesced)")
            continue
        found = terms(pointer, frozenset())
        if found and not any(found):
            reasons.append(
                f"{where} has no unit-stride axis: every tl.arange in its offsets is scaled "
                "(uncoalesced)"
            )
    return reasons
