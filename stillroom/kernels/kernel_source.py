"""The kernels of a recorded program (program.py), checked against a whitelist and rewritten into
the replay's canonical source. Trusted: runs in the parent, on text the candidate's process
reported, and never imports or runs it.

A kernel may be written as people write Triton: ``triton.language`` under any alias (``tl``, ``L``,
``from triton import language as lang``), module-level constants (``FLOOR = L.constexpr(0.0)``),
other ``@triton.jit`` functions, ``@triton.autotune``/``@triton.heuristics`` around it. What it may
contain is a whitelist, not a list of bans:

- statements: assignments, ``if``, ``for`` over ``range``/``tl.range``/``tl.static_range``,
  ``while``, ``break``, ``continue``, ``return``, ``assert``, ``pass``, expressions;
- expressions: arithmetic, comparisons, boolean operators, conditional expressions, subscripts,
  tuples and lists, number and string constants;
- names: the kernel's own parameters and locals, the builtins of ``BUILTINS``, and module-level
  names the extraction reported as ``triton.language`` (or a module under it), another recorded
  kernel, a number, string or ``tl`` dtype; nothing else of the candidate's module;
- attributes: a path under ``triton.language`` that resolves, on the real module, to something of
  ``triton.language`` (not ``tl.core.builtins``, ``tl.core.knobs`` or any module of the standard
  library it imports), or a member of ``VALUE_MEMBERS`` on a value (``x.to``, ``acc.dtype``); no
  name with a leading underscore anywhere;
- calls: ``triton.language`` functions, recorded kernels, the builtins, members of a value; no
  ``*args`` or ``**kwargs``;
- the ``@triton.jit`` functions of a trusted installed module (``TRUSTED``: Inductor's
  ``triton_helpers``, the libdevice stand-ins below), by attribute (``triton_helpers.max2``):
  their source and what their names are is read here, from the module installed beside this one,
  never from the record, so a candidate cannot put a body of its own under such a name;
- ``libdevice`` (``triton.language.extra.libdevice`` or a backend's): Triton's CPU interpreter
  cannot run it (its functions are stubs that return None), so each function becomes what the
  interpreter runs: ``triton.language``'s function of that name (``libdevice.exp`` is
  ``tl.exp``), or the Triton of ``stillroom.kernels.libdevice`` (``tanh``, ``pow``, ``isnan`` ...);
  one with neither is refused, naming it.

The canonical source names every module by one path from ``tl`` (``L.load`` becomes ``tl.load``),
writes module-level constants in as literals, names each kernel uniquely (``k0_relu_kernel``), drops
decorators (the recorded launch says which config of an autotuner ran) and a docstring (the first
statement, when it is a string: documentation, not a constant), annotates constexpr parameters and
in-body constexpr assignments (``RBLOCK: tl.constexpr = 256``, as Inductor writes them)
``tl.constexpr`` whatever alias the candidate used, and names a trusted module's function
``kt_<module>_<name>``. It runs in a namespace that holds
``tl``, ``triton`` and the builtins of ``BUILTINS`` only; the instrumented twin of it
(``instrument``) counts the operations the analysis needs (replay.py)."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import textwrap
from dataclasses import dataclass, field

# builtins a kernel may call (Triton's frontend handles each of them on constexprs)
BUILTINS = frozenset({"range", "min", "max", "int", "float", "bool", "len", "abs"})
# what a kernel may read of a value (a Triton tensor, dtype or constexpr): methods and properties
TENSOR_MEMBERS = {
    "T", "abs", "advance", "argmax", "argmin", "associative_scan", "atomic_add", "atomic_and",
    "atomic_cas", "atomic_load", "atomic_max", "atomic_min", "atomic_or", "atomic_store",
    "atomic_xchg", "atomic_xor", "broadcast_to", "cast", "cdiv", "ceil", "cos", "cumprod",
    "cumsum", "erf", "exp", "exp2", "expand_dims", "flip", "floor", "gather", "histogram", "item",
    "log", "log2", "logical_and", "logical_or", "max", "min", "permute", "ravel", "reduce",
    "reduce_or", "reshape", "rsqrt", "sigmoid", "sin", "softmax", "sort", "split", "sqrt",
    "sqrt_rn", "store", "sum", "to", "trans", "view", "xor_sum", "dtype", "shape", "type", "numel",
}  # fmt: skip
DTYPE_MEMBERS = {
    "element_ty", "primitive_bitwidth", "scalar", "is_bf16", "is_block", "is_bool", "is_floating",
    "is_fp16", "is_fp32", "is_fp64", "is_fp8", "is_int", "is_int1", "is_int8", "is_int16",
    "is_int32", "is_int64", "is_int_signed", "is_int_unsigned", "is_ptr", "is_uint8",
    "is_uint16", "is_uint32", "is_uint64", "is_standard_floating", "value",
}  # fmt: skip
VALUE_MEMBERS = frozenset(TENSOR_MEMBERS | DTYPE_MEMBERS)
LANGUAGE = "triton.language"
MAX_STRING = 200
MAX_SOURCE = 100_000  # characters of one kernel's source
# syntax tree levels of one kernel: far above what people write (Inductor's index expressions
# take a few), far below what Python's recursive tools (ast, copy, Triton's rewriter) survive
MAX_DEPTH = 100

_STATEMENTS = (
    ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.If, ast.For, ast.While,
    ast.Break, ast.Continue, ast.Pass, ast.Assert,
)  # fmt: skip
_EXPRESSIONS = (
    ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Constant,
    ast.Attribute, ast.Subscript, ast.Slice, ast.Name, ast.Tuple, ast.List, ast.keyword,
    ast.Load, ast.Store, ast.operator, ast.unaryop, ast.boolop, ast.cmpop, ast.arguments, ast.arg,
)  # fmt: skip
RANGES = {"range": "range", "tl.range": "range", "tl.static_range": "static"}
# installed modules whose @triton.jit functions a kernel may call by attribute -> the tag of their
# canonical names (kt_<tag>_<name>)
TRUSTED = {
    "torch._inductor.runtime.triton_helpers": "triton_helpers",
    "stillroom.kernels.libdevice": "libdevice",
}
TRUSTED_KID = "trusted:"  # "trusted:<module>:<name>", an id no extraction gives a kernel
LIBDEVICE = {
    "triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice",
    "triton.language.extra.hip.libdevice",
}  # fmt: skip
# libdevice's fast (approximate) and explicitly rounded variants: the function they approximate
LIBDEVICE_ALIASES = {
    "fast_expf": "exp", "fast_logf": "log", "fast_log2f": "log2", "fast_log10f": "log10",
    "fast_exp10f": "exp10", "fast_sinf": "sin", "fast_cosf": "cos", "fast_tanf": "tan",
    "fast_tanhf": "tanh", "fast_powf": "pow", "fast_dividef": "div_rn", "rsqrt_rn": "rsqrt",
    "fma_rn": "fma", "nearbyint": "rint", "finitef": "isfinite", "isfinited": "isfinite",
}  # fmt: skip


@dataclass
class Kernel:
    """One recorded kernel, checked: its canonical definition, the kernels it calls, which of its
    parameters are constexpr, and why it was refused (empty when it was not)."""

    kid: str
    name: str  # the candidate's name for it
    canonical: str  # its name in the replay's source
    tree: ast.FunctionDef | None = None
    text: str = ""  # the canonical definition, as source
    analysis: str = ""  # the same, instrumented for the analysis (instrument)
    calls: set[str] = field(default_factory=set)
    params: list[str] = field(default_factory=list)
    constexprs: set[str] = field(default_factory=set)
    reasons: list[str] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)  # of triton.language, for the replay to import


class _Language:
    """What ``triton.language`` holds, looked up on the real module (imported once)."""

    def __init__(self):
        import triton.language as tl

        self.tl = tl
        # dtype name ("fp32") -> its attribute of triton.language ("float32")
        self.dtypes = {}
        for name in dir(tl):
            value = getattr(tl, name)
            if isinstance(value, tl.dtype) and not name.startswith("_"):
                self.dtypes.setdefault(value.name, name)

    def resolve(self, path: str):
        """The object ``path`` (dotted, starting ``triton.language``) names, or why not."""
        import importlib

        parts = path.split(".")
        obj = importlib.import_module(LANGUAGE)
        for i, part in enumerate(parts[2:], start=2):
            try:
                obj = getattr(obj, part)
            except AttributeError:
                # a submodule not imported yet (triton.language.extra.libdevice): the package's
                obj = _submodule(".".join(parts[: i + 1]))
                if obj is None:
                    return None, f"{'.'.join(parts[: i + 1])} does not exist"
            if not self.of_language(obj):
                return None, f"{'.'.join(parts[: i + 1])} is not part of triton.language"
        return obj, None

    @staticmethod
    def of_language(obj) -> bool:
        import types

        if isinstance(obj, (bool, int, float, str)) or obj is None:
            return True
        if isinstance(obj, types.ModuleType):
            return obj.__name__ == LANGUAGE or obj.__name__.startswith(LANGUAGE + ".")
        while inspect.isfunction(getattr(obj, "fn", None)):  # a @jit function of the library
            obj = obj.fn
        obj = getattr(obj, "func", obj)  # a functools.partial
        module = getattr(obj, "__module__", None)
        if module == "triton.runtime.interpreter":
            # a member of triton.language as Triton's interpreter patches it in place (a process
            # that interpreted a kernel may keep such patches)
            return True
        if not isinstance(module, str) or not module.startswith(LANGUAGE):
            module = type(obj).__module__
        return module == LANGUAGE or module.startswith(LANGUAGE + ".")


def _submodule(name: str):
    """The module ``name`` of triton.language, imported; None when there is none."""
    import importlib
    import importlib.util

    try:
        if importlib.util.find_spec(name) is None:
            return None
        return importlib.import_module(name)
    except (ImportError, ValueError):
        return None


def modules(path: str) -> list[str]:
    """The modules along ``path`` (below triton.language) that must be imported for the canonical
    source to reach it by attributes."""
    import types

    parts = path.split(".")
    found = []
    for i in range(3, len(parts) + 1):
        obj, why = language().resolve(".".join(parts[:i]))
        if why is None and isinstance(obj, types.ModuleType):
            found.append(obj.__name__)
    return found


def trusted_kid(module: str, name: str) -> str:
    return f"{TRUSTED_KID}{module}:{name}"


@functools.cache
def trusted_record(kid: str) -> dict | None:
    """The record of a trusted module's @triton.jit function (``kid``: trusted_kid), made here
    from the installed module as the extraction makes a candidate's: its source and what each
    module-level name it reads is; None when ``kid`` names no such function."""
    from . import extract

    module_name, _, name = kid.removeprefix(TRUSTED_KID).partition(":")
    if not kid.startswith(TRUSTED_KID) or module_name not in TRUSTED or not name.isidentifier():
        return None
    try:
        fn = getattr(importlib.import_module(module_name), name, None)
    except ImportError:  # a torch without Inductor's runtime: no such function here
        return None
    inner = getattr(fn, "fn", None)
    if not inspect.isfunction(inner) or inner.__module__ != module_name:
        return None

    class Trusted(extract._Kernels):
        def add(self, jit):  # a kernel it calls: another trusted function, by id
            called = getattr(jit, "fn", jit)
            return trusted_kid(called.__module__, called.__name__)

    source = textwrap.dedent(inspect.getsource(inner))
    names = [n for n in extract._free_names(source) if n in inner.__globals__]
    describe = Trusted().describe
    return {
        "name": name,
        "source": source,
        "globals": {n: describe(inner.__globals__[n]) for n in names},
    }


_language: list[_Language] = []


def language() -> _Language:
    if not _language:
        _language.append(_Language())
    return _language[0]


def _unpatched(obj):
    """``obj`` as triton.language defines it: Triton's interpreter replaces members of ``tl`` in
    place with wrappers while it runs a kernel, and may leave some behind."""
    while getattr(obj, "__module__", None) == "triton.runtime.interpreter":
        member = (getattr(obj, "__kwdefaults__", None) or {}).get("member")
        if member is None:
            break
        obj = member
    return obj


def _path_expr(path: str) -> ast.expr:
    """``tl.a.b`` for ``triton.language.a.b``, or ``tl.b`` where that is the same object (Triton's
    interpreter patches the members of ``tl`` and ``tl.math`` only); ``triton`` for the package."""
    parts = path.split(".")
    if path == "triton":
        return ast.Name("triton", ast.Load())
    if len(parts) > 3:
        tl = language().tl
        obj, why = language().resolve(path)
        if why is None and _unpatched(getattr(tl, parts[-1], None)) is _unpatched(obj):
            parts = [*parts[:2], parts[-1]]
    node: ast.expr = ast.Name("tl", ast.Load())
    for part in parts[2:]:
        node = ast.Attribute(node, part, ast.Load())
    return node


def _dotted(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - only for messages
        return type(node).__name__


def _locals(fn: ast.FunctionDef) -> set[str]:
    names = {a.arg for a in fn.args.args}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


class _Checker(ast.NodeTransformer):
    """Checks one kernel's body against the whitelist and rewrites it into canonical form."""

    def __init__(self, kernel: Kernel, globals_: dict, canonical: dict[str, str]):
        self.kernel, self.globals, self.canonical = kernel, globals_, canonical
        self.local: set[str] = set()

    def refuse(self, node: ast.AST, why: str) -> None:
        line = getattr(node, "lineno", None)
        where = f"kernel {self.kernel.name}" + (f", line {line}" if line else "")
        self.kernel.reasons.append(f"{where}: {why}")

    # what a module-level name stands for, as an expression of the canonical source
    def global_expr(self, node: ast.Name) -> ast.expr | None:
        name = node.id
        entry = self.globals.get(name)
        if entry is None:
            if name in BUILTINS:
                return node
            self.refuse(node, f"uses {name}, which is not defined for the kernel")
            return None
        if not isinstance(entry, dict) or len(entry) != 1:
            self.refuse(node, f"uses {name}, reported as {repr(entry)[:100]}")
            return None
        ((kind, value),) = entry.items()
        if kind == "module":
            if value == "triton" or value == LANGUAGE or str(value).startswith(LANGUAGE + "."):
                return self.language_path(node, str(value), name)
            self.refuse(node, f"uses {name} (module {value}): a kernel uses triton.language only")
            return None
        if kind == "language":  # an object of triton.language imported by name
            path = str(value)
            if path.startswith(LANGUAGE + "."):
                return self.language_path(node, path, name)
            self.refuse(node, f"uses {name} ({path})")
            return None
        if kind == "kernel":
            called = self.kernel_name(str(value))
            if called is None:
                self.refuse(node, f"calls {name}, a kernel whose source was not recorded")
                return None
            return ast.copy_location(ast.Name(called, ast.Load()), node)
        if kind == "value":
            if isinstance(value, str) and len(value) > MAX_STRING:
                self.refuse(node, f"uses {name}, a string of {len(value)} characters")
                return None
            if value is None or isinstance(value, (bool, int, float, str)):
                return ast.copy_location(ast.Constant(value), node)
        if kind == "dtype" and value in language().dtypes:
            return ast.copy_location(
                ast.Attribute(ast.Name("tl", ast.Load()), language().dtypes[value], ast.Load()),
                node,
            )
        what = str(value)[:100] if kind == "other" else f"{kind} {repr(value)[:100]}"
        self.refuse(
            node,
            f"uses {name} ({what}): a kernel reads only triton.language, @triton.jit functions "
            "and constants of its module",
        )
        return None

    def kernel_name(self, kid: str) -> str | None:
        """The canonical name of the kernel ``kid`` (recorded, or a trusted module's function),
        which this kernel calls; None when there is none."""
        if kid.startswith(TRUSTED_KID) and trusted_record(kid) is not None:
            module, _, name = kid.removeprefix(TRUSTED_KID).partition(":")
            self.canonical.setdefault(kid, f"kt_{TRUSTED[module]}_{name}")
        called = self.canonical.get(kid)
        if called is not None:
            self.kernel.calls.add(kid)
        return called

    def trusted_member(self, node: ast.Attribute) -> ast.expr | None:
        """``triton_helpers.max2``: a @triton.jit function of a trusted module, named by the
        module the record says the name is (its body is the installed one, whatever the candidate's
        process held); None when ``node`` is not such an attribute."""
        value = node.value
        if not isinstance(value, ast.Name) or value.id in self.local:
            return None
        entry = self.globals.get(value.id)
        module = entry.get("module") if isinstance(entry, dict) and len(entry) == 1 else None
        if module not in TRUSTED:
            return None
        called = self.kernel_name(trusted_kid(module, node.attr))
        if called is None:
            self.refuse(node, f"uses {value.id}.{node.attr}: no @triton.jit function of {module}")
            return node
        return ast.copy_location(ast.Name(called, ast.Load()), node)

    def libdevice(self, node: ast.AST, function: str) -> ast.expr | None:
        """libdevice's ``function`` as the interpreter can run it (the module docstring)."""
        function = LIBDEVICE_ALIASES.get(function, function)
        if language().tl.core.is_builtin(getattr(language().tl.math, function, None)):
            return ast.copy_location(_path_expr(f"{LANGUAGE}.math.{function}"), node)
        called = self.kernel_name(trusted_kid("stillroom.kernels.libdevice", function))
        if called is None:
            self.refuse(
                node,
                f"uses libdevice.{function}, which Triton's CPU interpreter cannot run (its "
                "libdevice functions are stubs) and which has no equivalent here",
            )
            return None
        return ast.copy_location(ast.Name(called, ast.Load()), node)

    def language_path(self, node: ast.AST, path: str, name: str | None) -> ast.expr | None:
        """The canonical expression of ``path`` (``triton``, or under triton.language, checked
        on the real module); None (refused) where it leads outside. ``name``: the candidate's
        name for it, in the reason."""
        if path not in ("triton", LANGUAGE):
            _, why = language().resolve(path)
            if why:
                self.refuse(node, f"uses {name} ({why})" if name else f"uses {why}")
                return None
            module, _, function = path.rpartition(".")
            if module in LIBDEVICE:
                return self.libdevice(node, function)
            self.kernel.modules.update(modules(path))
        return ast.copy_location(_path_expr(path), node)

    def generic_visit(self, node):
        if not isinstance(node, _STATEMENTS + _EXPRESSIONS):
            self.refuse(node, f"{type(node).__name__} is not allowed in a Triton kernel")
            return node
        return super().generic_visit(node)

    def visit_Name(self, node: ast.Name):
        if node.id.startswith("__"):
            self.refuse(node, f"uses {node.id}")
            return node
        if isinstance(node.ctx, ast.Store) or node.id in self.local:
            return node
        return self.global_expr(node) or node

    def visit_Attribute(self, node: ast.Attribute):
        if node.attr.startswith("_"):
            self.refuse(node, f"uses .{node.attr} (no private or dunder attribute)")
            return node
        if not isinstance(node.ctx, ast.Load):
            self.refuse(node, f"assigns to {_dotted(node)}")
            return node
        trusted = self.trusted_member(node)
        if trusted is not None:
            return trusted
        node = self.generic_visit(node)
        path = _module_path(node)
        if path is not None:
            if path == "triton":
                return node
            if not (path == LANGUAGE or path.startswith(LANGUAGE + ".")):
                self.refuse(node, f"uses {path}: below triton, only triton.language")
                return node
            return self.language_path(node, path, None) or node
        if node.attr not in VALUE_MEMBERS:
            self.refuse(node, f"uses .{node.attr} of a value (not a Triton tensor member)")
        return node

    def visit_Call(self, node: ast.Call):
        node = self.generic_visit(node)
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                self.refuse(node, "calls with *args")
        for kw in node.keywords:
            if kw.arg is None:
                self.refuse(node, "calls with **kwargs")
        func = node.func
        if isinstance(func, ast.Name):
            if func.id not in self.local and (
                func.id in self.canonical.values() or func.id in BUILTINS
            ):
                return node
            self.refuse(node, f"calls {func.id} (only triton.language, kernels and builtins)")
        elif isinstance(func, ast.Attribute):
            path = _module_path(func)
            if path is not None and path.startswith(LANGUAGE + "."):
                return node
            if path is None and func.attr in VALUE_MEMBERS:
                return node
            self.refuse(node, f"calls {_dotted(func)}")
        else:
            self.refuse(node, f"calls {_dotted(func)}")
        return node

    def visit_Constant(self, node: ast.Constant):
        value = node.value
        if isinstance(value, str) and len(value) > MAX_STRING:
            self.refuse(node, f"a string constant of {len(value)} characters")
        elif not (value is None or value is Ellipsis or isinstance(value, (bool, int, float, str))):
            self.refuse(node, f"a {type(value).__name__} constant")
        return node

    def visit_Assign(self, node: ast.Assign):
        for target in node.targets:
            self._target(target)
        return self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign):
        self._target(node.target)
        return self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign):
        self._target(node.target)
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        annotation, constexpr = _annotation(node.annotation, self)
        if constexpr:  # a compile-time value (Inductor's RBLOCK: tl.constexpr = 256)
            node.annotation, node.simple = annotation, 1
            node.value = self.visit(node.value)
            return node
        # the annotation of any other local is dropped: Triton infers it
        assign = ast.copy_location(ast.Assign([node.target], node.value), node)
        return self.generic_visit(assign)

    def visit_For(self, node: ast.For):
        self._target(node.target)
        if node.orelse:
            self.refuse(node, "for ... else")
        return self.generic_visit(node)

    def visit_While(self, node: ast.While):
        if node.orelse:
            self.refuse(node, "while ... else")
        return self.generic_visit(node)

    def _target(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._target(elt)
        elif not isinstance(target, ast.Name):
            self.refuse(target, f"assigns to {_dotted(target)} (a kernel assigns names only)")


def _module_path(node: ast.AST) -> str | None:
    """The dotted module path an attribute chain of the canonical source stands for (rooted at
    ``tl`` or ``triton``), or None when it is rooted at a value."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in ("tl", "triton"):
        return None
    root = LANGUAGE if node.id == "tl" else "triton"
    return ".".join([root, *reversed(parts)])


def _annotation(node: ast.expr | None, checker: _Checker) -> tuple[ast.expr | None, bool]:
    """A parameter's canonical annotation, and whether it marks a constexpr: ``tl.constexpr``
    under any alias (or as a string), a ``tl`` dtype, or nothing."""
    if node is None:
        return None, False
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value.strip()
        if text.split(".")[-1] == "constexpr":
            return _path_expr(f"{LANGUAGE}.constexpr"), True
        return None, False
    before = len(checker.kernel.reasons)
    canonical = checker.visit(node)
    del checker.kernel.reasons[before:]  # an annotation nobody runs refuses nothing
    path = _module_path(canonical)
    if path == f"{LANGUAGE}.constexpr":
        return canonical, True
    if path and path.startswith(LANGUAGE + "."):
        obj, why = language().resolve(path)
        if why is None and isinstance(obj, language().tl.dtype):
            return canonical, False
    return None, False


def _default(node: ast.expr, checker: _Checker) -> ast.expr:
    """A parameter's default, which must be a constant, a tl dtype or ``tl.constexpr`` of one."""
    node = checker.visit(node)
    if isinstance(node, ast.Call) and _module_path(node.func) == f"{LANGUAGE}.constexpr":
        node = node.args[0] if len(node.args) == 1 and not node.keywords else node
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return node
    if isinstance(node, ast.Constant):
        return node
    path = _module_path(node)
    if path and isinstance(language().resolve(path)[0], language().tl.dtype):
        return node
    checker.refuse(node, f"a parameter default of {_dotted(node)} (only a constant)")
    return ast.Constant(None)


def check(kernels: dict[str, dict]) -> dict[str, Kernel]:
    """Each recorded kernel (kid -> {"name", "source", "globals"}) checked and rewritten, with
    the trusted modules' functions they call (read from the installed modules)."""
    canonical = {
        kid: f"k{i}_{re.sub(r'[^0-9A-Za-z_]', '_', str(r.get('name', 'kernel')))[:60]}"
        for i, (kid, r) in enumerate(kernels.items())
    }
    out = {}
    for kid, rec in kernels.items():
        out[kid] = _checked(kid, rec, canonical)
        if kid.startswith(TRUSTED_KID):  # a record cannot stand in for a trusted function
            out[kid].reasons.append(f"kernel {out[kid].name}: its id {kid!r} is reserved")
    pending = [c for k in out.values() for c in k.calls]
    while pending:
        kid = pending.pop()
        if kid not in out:
            out[kid] = _checked(kid, trusted_record(kid), canonical)
            pending += out[kid].calls
    return out


def _checked(kid: str, rec: dict, canonical: dict[str, str]) -> Kernel:
    name = str(rec.get("name", kid))
    kernel = Kernel(kid, name, canonical[kid])
    source, globals_ = rec.get("source"), rec.get("globals")
    if not isinstance(source, str) or not isinstance(globals_, dict):
        kernel.reasons.append(f"kernel {name}: no source was recorded")
    elif len(source) > MAX_SOURCE:
        kernel.reasons.append(f"kernel {name}: its source has {len(source)} characters")
    else:
        try:
            _check_one(kernel, source, globals_, canonical)
        # Python's own limits on the candidate's text: the kernel is refused, nothing else
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            kernel.tree = None
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
            kernel.reasons.append(f"kernel {name}: its source cannot be checked ({why})")
    kernel.reasons = list(dict.fromkeys(kernel.reasons))
    return kernel


def _depth(tree: ast.AST) -> int:
    """How many levels the syntax tree nests, counted without recursion."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        todo += [(child, level + 1) for child in ast.iter_child_nodes(node)]
    return deepest


def _check_one(kernel: Kernel, source: str, globals_: dict, canonical: dict[str, str]) -> None:
    tree = ast.parse(textwrap.dedent(source))
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        kernel.reasons.append(
            f"kernel {kernel.name}: its source cannot be checked (its syntax nests {depth} levels "
            f"deep, more than {MAX_DEPTH})"
        )
        return
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        kernel.reasons.append(f"kernel {kernel.name}: its source is not one function definition")
        return
    fn = tree.body[0]
    checker = _Checker(kernel, globals_, canonical)
    args = fn.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        checker.refuse(fn, "takes *args, **kwargs or keyword-only parameters")
    checker.local = _locals(fn)
    reserved = {"tl", "triton"} | set(canonical.values())
    for taken in sorted(n for n in checker.local if n in reserved or n.startswith("kt_")):
        checker.refuse(fn, f"a local named {taken} (the canonical source's own name)")
    params = []
    for arg in args.args:
        if arg.arg.startswith("__"):
            checker.refuse(fn, f"a parameter named {arg.arg}")
        annotation, constexpr = _annotation(arg.annotation, checker)
        params.append(ast.arg(arg.arg, annotation))
        kernel.params.append(arg.arg)
        if constexpr:
            kernel.constexprs.add(arg.arg)
    defaults = [_default(d, checker) for d in args.defaults]
    statements = fn.body
    first = statements[0] if statements else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        if isinstance(first.value.value, str):  # the docstring: documentation, not a constant
            statements = statements[1:]
    body = []
    for stmt in statements:
        if not isinstance(stmt, _STATEMENTS):
            checker.refuse(stmt, f"{type(stmt).__name__} is not allowed in a Triton kernel")
            continue
        body.append(checker.visit(stmt))
    fn.name, fn.decorator_list, fn.returns = kernel.canonical, [], None
    fn.body = body or [ast.Pass()]
    fn.args = ast.arguments(
        posonlyargs=[], args=params, kwonlyargs=[], kw_defaults=[], defaults=defaults
    )
    kernel.tree = ast.fix_missing_locations(fn)
    kernel.text = ast.unparse(kernel.tree)
    kernel.analysis = ast.unparse(_instrumented(kernel.tree))
    # text that parses may still not compile (break outside a loop, a repeated parameter or
    # keyword): Python's compiler says so here, as a reason, not in the replay
    for text in (kernel.text, kernel.analysis):
        compile(text, f"<kernel {kernel.name}>", "exec")


HEADER = (
    "# The kernels of one candidate's program, checked and rewritten by stillroom "
    "(stillroom/kernels/kernel_source.py).\n# Run in a namespace holding tl (triton.language), "
    "triton and a few builtins only.\n"
)


def source(kernels: list[Kernel]) -> str:
    """The canonical module source of ``kernels`` (checked, none refused)."""
    return HEADER + "\n\n".join(k.text for k in kernels) + "\n"


# The instrumentation's names: a kernel's own names never start with "__" (refused above).
COUNT, LOOP, LOOP_END, ITERATION, BLOCK = (
    "__sr_count", "__sr_loop", "__sr_loop_end", "__sr_iteration", "__sr_block"
)  # fmt: skip


def operations(node: ast.AST) -> int:
    """Operations of an expression or simple statement: one per call and per arithmetic,
    comparison, boolean or conditional operation (the rule reward's instruction estimate)."""
    return sum(
        isinstance(n, (ast.Call, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp))
        for n in ast.walk(node)
    )


class _Instrument(ast.NodeTransformer):
    """Counts each statement's operations as it runs, and marks each loop's iterations
    (replay.Analysis counts a loop that stays a loop, over run-time bounds or a ``while``, as its
    costliest iteration; an unrolled one, over constants or a ``tl.static_range``, every
    iteration). Loops are named ``<kernel>:<n>``, unique across the kernels of a program."""

    def __init__(self, kernel: str):
        self.kernel, self.loops = kernel, 0

    def ident(self) -> ast.Constant:
        self.loops += 1
        return ast.Constant(f"{self.kernel}:{self.loops}")

    @staticmethod
    def count(n: int, like: ast.AST) -> ast.stmt:
        call = ast.Call(ast.Name(COUNT, ast.Load()), [ast.Constant(n)], [])
        return ast.copy_location(ast.Expr(call), like)

    @staticmethod
    def call(name: str, args: list, like: ast.AST) -> ast.stmt:
        return ast.copy_location(ast.Expr(ast.Call(ast.Name(name, ast.Load()), args, [])), like)

    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for stmt in stmts:
            visited = self.visit(stmt)
            out += visited if isinstance(visited, list) else [visited]
        return out

    def generic_visit(self, node):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return, ast.Assert)):
            n = operations(node)
            return [self.count(n, node), node] if n else [node]
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef):
        node.body = self.block(node.body)
        return node

    def visit_If(self, node: ast.If):
        node.body, node.orelse = self.block(node.body), self.block(node.orelse)
        return [self.count(operations(node.test), node), node]

    def visit_For(self, node: ast.For):
        ident = self.ident()
        node.body = self.block(node.body)
        before = [self.count(operations(node.iter), node)]
        it = node.iter
        kind = RANGES.get(_dotted(it.func)) if isinstance(it, ast.Call) else None
        if kind is not None:
            node.iter = ast.Call(
                ast.Name(LOOP, ast.Load()), [ident, ast.Constant(kind), *it.args], it.keywords
            )
        return [*before, node, self.call(LOOP_END, [ident], node)]

    def visit_While(self, node: ast.While):
        ident = self.ident()
        node.body = [self.call(ITERATION, [ident], node), *self.block(node.body)]
        return [self.count(operations(node.test), node), node, self.call(LOOP_END, [ident], node)]


class _Blocks(ast.NodeTransformer):
    """Passes the value of every call the kernel makes through ``__sr_block``, which measures
    the blocks it builds whatever builds them (arange, full, reshape, join, broadcast_to, dot, a
    helper's result)."""

    def visit_Call(self, node: ast.Call):
        node = self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id.startswith("__sr_"):
            return node
        return ast.copy_location(ast.Call(ast.Name(BLOCK, ast.Load()), [node], []), node)


def _instrumented(tree: ast.FunctionDef) -> ast.FunctionDef:
    """A kernel's canonical definition with the analysis's counters (replay.Analysis) in it."""
    import copy

    counted = _Instrument(tree.name).visit(copy.deepcopy(tree))
    return ast.fix_missing_locations(_Blocks().visit(counted))


def instrument(kernels: list[Kernel]) -> str:
    """The canonical source with the analysis's counters in it."""
    return HEADER + "\n\n".join(k.analysis for k in kernels) + "\n"
