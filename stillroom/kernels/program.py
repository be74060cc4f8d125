"""What a candidate's forward did, as a program the replay can run: its buffers, the launches of
checked Triton kernels and the few host operations between them, and what it returned.

The extraction (extract.py) reports a record of it from inside the sandbox, as data; ``parse``
here, in the parent, checks every field of that record against the case it was made for and the
limits below, and checks every kernel against the whitelist (kernel_source.py). The record is
untrusted: a forged one can only describe another program, and the replay (replay.py) runs what
the program says on inputs the candidate never saw. So nothing the candidate computed on its own
inputs, with torch or in Python, can reach an output: a constant it recorded holds no bytes in
the replay.

A program's storages are where its tensors live: an ``input`` of the forward, a ``state`` tensor
(a parameter or buffer of the module, filled from the reference's weights), an ``alloc`` made in
the forward (empty, zeros, ones, full: an empty one is filled with NaN in the replay, so an element
no kernel writes cannot match by luck), or a ``constant`` (any other tensor a launch or the return
reached: uninitialised memory in the replay, as an empty allocation; only the problem's inputs,
parameters and buffers carry values into a program). Every tensor is a view of a storage: a
dtype, an offset, a shape and strides (so view, reshape, permute, transpose, expand, narrow,
slicing ... are views and nothing more). Steps, in order: ``launch`` (a kernel, its grid, its
arguments, num_warps and num_stages; an autotuned launch holds each config as an alternative, with
the host steps its autotuner's hooks take before it: ``before``), ``fill`` (zero_, fill_) and
``copy`` (contiguous, clone or copy_ that copies)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from . import kernel_source

DTYPES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
    "int32": 4, "int64": 8, "bool": 1,
}  # fmt: skip
MAX_DIMS = 8
MAX_KERNELS = 64
MAX_STEPS = 4096
MAX_STORAGES = 4096
MAX_ALTERNATIVES = 64
MAX_GRID = 1 << 31
MAX_WARPS = 1024  # far above any GPU's; the launch rules judge the value
MAX_INT = 1 << 63
RECORD_BYTES = 32 << 20  # the JSON of one extraction's record


class ProgramError(ValueError):
    """The record does not describe a program the replay can run: the candidate's failure."""


@dataclass
class Launch:
    kernel: str  # canonical name
    grid: list[int]
    args: dict[str, dict]  # parameter -> {"tensor": i} | {"value": v} | {"dtype": name}
    constexprs: dict[str, Any]  # the constexpr arguments' values (defaults included)
    num_warps: int
    num_stages: int
    name: str  # the candidate's name for the kernel
    before: list[dict] = field(default_factory=list)  # fills and copies of its autotuner's hooks


@dataclass
class Program:
    storages: list[dict]
    tensors: list[dict]  # {"storage", "dtype", "offset", "shape", "stride"}
    steps: list[dict]  # {"op": "launch", "alternatives": [Launch]} | fill | copy
    returns: Any
    launches: int = 0
    returned: list[int] = field(default_factory=list)  # tensor indices, flattened

    def to_json(self) -> dict:
        def step(s: dict) -> dict:
            if s["op"] != "launch":
                return s
            return {**s, "alternatives": [vars(a) for a in s["alternatives"]]}

        return {
            "storages": self.storages,
            "tensors": self.tensors,
            "steps": [step(s) for s in self.steps],
            "returns": self.returns,
        }

    def summary(self, limit: int = 24) -> list[str]:
        """One line per step, for the reward's record (what was scored)."""
        lines = []
        for s in self.steps[:limit]:
            if s["op"] == "launch":
                a = s["alternatives"][0]
                consts = ", ".join(f"{k}={v}" for k, v in sorted(a.constexprs.items()))
                more = (
                    f" (+{len(s['alternatives']) - 1} configs)"
                    if len(s["alternatives"]) > 1
                    else ""
                )
                lines.append(
                    f"launch {a.name} grid {tuple(a.grid)} {consts} num_warps={a.num_warps}{more}"
                )
            else:
                lines.append(s["op"])
        if len(self.steps) > limit:
            lines.append(f"... {len(self.steps) - limit} more steps")
        return lines


def _int(value, what: str, low: int = -MAX_INT, high: int = MAX_INT) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProgramError(f"{what} must be an integer in [{low}, {high}], got {value!r}")
    return value


def _scalar(value, what: str):
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _int(value, what)
    if isinstance(value, float):
        return value
    if isinstance(value, str) and len(value) <= kernel_source.MAX_STRING:
        return value
    raise ProgramError(f"{what} must be a number, a bool, None or a short string, got {value!r}")


class _Parser:
    def __init__(self, case: dict, state: dict[str, tuple[str, list[int]]], checked):
        self.case, self.state, self.checked = case, state, checked
        self.storages: list[dict] = []
        self.tensors: list[dict] = []
        self.tensor_ids: dict[str, int] = {}

    def storage(self, raw, i: int) -> dict:
        what = f"storage {i}"
        if not isinstance(raw, dict):
            raise ProgramError(f"{what} is not an object")
        kind = raw.get("kind")
        nbytes = _int(raw.get("nbytes"), f"{what}: nbytes", 0, 1 << 48)
        if kind == "input":
            index = _int(raw.get("index"), f"{what}: index", 0, len(self.case["inputs"]) - 1)
            spec = self.case["inputs"][index]
            if "nbytes" not in spec:
                raise ProgramError(f"{what}: input {index} is not a tensor")
            if nbytes != spec["nbytes"]:
                raise ProgramError(
                    f"{what}: input {index} holds {spec['nbytes']} bytes, not {nbytes}"
                )
            return {"kind": "input", "index": index, "nbytes": nbytes}
        if kind == "state":
            name = raw.get("name")
            if not isinstance(name, str) or name not in self.state:
                raise ProgramError(f"{what}: {name!r} is no parameter or buffer of the model")
            dtype, shape = self.state[name]
            if nbytes != math.prod(shape) * DTYPES[dtype]:
                raise ProgramError(f"{what}: {name} holds {math.prod(shape) * DTYPES[dtype]} bytes")
            return {"kind": "state", "name": name, "nbytes": nbytes}
        if kind == "alloc":
            dtype = raw.get("dtype")
            if dtype not in DTYPES:
                raise ProgramError(f"{what}: dtype {dtype!r}")
            fill = raw.get("fill")
            if fill is not None and (isinstance(fill, bool) or not isinstance(fill, (int, float))):
                raise ProgramError(f"{what}: fill {fill!r}")
            return {"kind": "alloc", "nbytes": nbytes, "dtype": dtype, "fill": fill}
        if kind == "constant":
            return {"kind": "constant", "nbytes": nbytes}
        raise ProgramError(f"{what}: kind {kind!r}")

    def tensor(self, raw, what: str) -> int:
        if not isinstance(raw, dict):
            raise ProgramError(f"{what}: not a tensor")
        key = json.dumps(raw, sort_keys=True)
        if key in self.tensor_ids:
            return self.tensor_ids[key]
        storage = _int(raw.get("storage"), f"{what}: storage", 0, len(self.storages) - 1)
        dtype = raw.get("dtype")
        if dtype not in DTYPES:
            raise ProgramError(f"{what}: dtype {dtype!r}")
        shape, stride = raw.get("shape"), raw.get("stride")
        if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride):
            raise ProgramError(f"{what}: shape and stride must be lists of one length")
        if len(shape) > MAX_DIMS:
            raise ProgramError(f"{what}: more than {MAX_DIMS} dimensions")
        shape = [_int(s, f"{what}: shape", 0, 1 << 40) for s in shape]
        stride = [_int(s, f"{what}: stride", 0, 1 << 40) for s in stride]
        offset = _int(raw.get("offset"), f"{what}: offset", 0, 1 << 48)
        size = DTYPES[dtype]
        if all(shape):
            last = offset + sum((n - 1) * s for n, s in zip(shape, stride, strict=True))
            if (last + 1) * size > self.storages[storage]["nbytes"]:
                raise ProgramError(f"{what}: reaches beyond its storage")
        self.tensors.append(
            {"storage": storage, "dtype": dtype, "offset": offset, "shape": shape, "stride": stride}
        )
        self.tensor_ids[key] = len(self.tensors) - 1
        return len(self.tensors) - 1

    def launch(self, raw, what: str) -> Launch:
        if not isinstance(raw, dict):
            raise ProgramError(f"{what}: not an object")
        kid = raw.get("kernel")
        kernel = self.checked.get(kid) if isinstance(kid, str) else None
        if kernel is None:
            raise ProgramError(f"{what}: kernel {kid!r} was not recorded")
        grid = raw.get("grid")
        if not isinstance(grid, list) or not 1 <= len(grid) <= 3:
            raise ProgramError(f"{what}: grid must hold 1 to 3 sizes, got {grid!r}")
        grid = [_int(g, f"{what}: grid", 0, MAX_GRID) for g in grid]
        if math.prod(grid) > MAX_GRID:
            raise ProgramError(f"{what}: a grid of {math.prod(grid)} programs")
        args_raw = raw.get("args")
        if not isinstance(args_raw, dict):
            raise ProgramError(f"{what}: args")
        unknown = sorted(set(args_raw) - set(kernel.params))
        if unknown:
            raise ProgramError(f"{what}: kernel {kernel.name} has no parameter {unknown}")
        args, constexprs = {}, {}
        for name, value in args_raw.items():
            where = f"{what}: argument {name} of {kernel.name}"
            if not isinstance(value, dict) or len(value) != 1:
                raise ProgramError(f"{where}: {value!r}")
            ((kind, v),) = value.items()
            if kind == "tensor":
                if name in kernel.constexprs:
                    raise ProgramError(f"{where}: a tensor for a constexpr parameter")
                args[name] = {"tensor": self.tensor(v, where)}
            elif kind == "value":
                args[name] = {"value": _scalar(v, where)}
            elif kind == "dtype" and v in kernel_source.language().dtypes:
                args[name] = {"dtype": v}
            else:
                raise ProgramError(f"{where}: {value!r}")
            if name in kernel.constexprs:
                constexprs[name] = v
        before = raw.get("before", [])
        if not isinstance(before, list) or len(before) > MAX_STEPS:
            raise ProgramError(f"{what}: before: a list of at most {MAX_STEPS} steps")
        return Launch(
            kernel=kernel.canonical,
            grid=grid,
            args=args,
            constexprs=constexprs,
            num_warps=_int(raw.get("num_warps", 4), f"{what}: num_warps", 1, MAX_WARPS),
            num_stages=_int(raw.get("num_stages", 3), f"{what}: num_stages", 0, 64),
            name=kernel.name,
            before=[self.host(s, f"{what}: a step of an autotuner's hook") for s in before],
        )

    def host(self, s, what: str) -> dict:
        """A fill or a copy."""
        op = s.get("op") if isinstance(s, dict) else None
        if op == "fill":
            value = s.get("value")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProgramError(f"{what}: fill value {value!r}")
            return {"op": "fill", "tensor": self.tensor(s.get("tensor"), what), "value": value}
        if op == "copy":  # element by element in row-major order (contiguous, reshape)
            dst, src = self.tensor(s.get("dst"), what), self.tensor(s.get("src"), what)
            a, b = self.tensors[dst], self.tensors[src]
            if math.prod(a["shape"]) != math.prod(b["shape"]) or a["dtype"] != b["dtype"]:
                raise ProgramError(f"{what}: a copy between tensors of another size or dtype")
            return {"op": "copy", "dst": dst, "src": src}
        raise ProgramError(f"{what}: op {op!r}")

    def returns(self, raw, what: str, depth: int = 0):
        if not isinstance(raw, dict) or len(raw) != 1 or depth > MAX_DIMS:
            raise ProgramError(f"{what}: {str(raw)[:200]}")
        ((kind, v),) = raw.items()
        if kind == "tensor":
            return {"tensor": self.tensor(v, what)}
        if kind in ("tuple", "list") and isinstance(v, list) and len(v) <= 64:
            return {kind: [self.returns(x, what, depth + 1) for x in v]}
        if kind == "value":
            return {"value": _scalar(v, what)}
        raise ProgramError(f"{what}: {kind!r}")

    def program(self, raw: dict) -> Program:
        storages = raw.get("storages")
        if not isinstance(storages, list) or len(storages) > MAX_STORAGES:
            raise ProgramError(f"storages: a list of at most {MAX_STORAGES}")
        for i, s in enumerate(storages):
            self.storages.append(self.storage(s, i))
        steps_raw = raw.get("steps")
        if not isinstance(steps_raw, list) or len(steps_raw) > MAX_STEPS:
            raise ProgramError(f"steps: a list of at most {MAX_STEPS}")
        steps, launches = [], 0
        for i, s in enumerate(steps_raw):
            what = f"step {i}"
            op = s.get("op") if isinstance(s, dict) else None
            if op == "launch":
                alternatives = s.get("alternatives")
                if (
                    not isinstance(alternatives, list)
                    or not 1 <= len(alternatives) <= MAX_ALTERNATIVES
                ):
                    raise ProgramError(f"{what}: 1 to {MAX_ALTERNATIVES} alternatives")
                steps.append(
                    {"op": "launch", "alternatives": [self.launch(a, what) for a in alternatives]}
                )
                launches += 1
            else:
                steps.append(self.host(s, what))
        returns = self.returns(raw.get("returns"), "returns")
        program = Program(self.storages, self.tensors, steps, returns, launches)
        program.returned = list(_flat(returns))
        return program


def _flat(returns):
    if "tensor" in returns:
        yield returns["tensor"]
    for kind in ("tuple", "list"):
        for r in returns.get(kind, []):
            yield from _flat(r)


@dataclass
class Parsed:
    """The checked record: one program per signature (or why not), the kernels by id, and the
    reasons that refuse the whole record."""

    programs: list[Program | None]
    errors: list[str | None]  # per signature: the forward's failure, or why its program is refused
    kernels: dict[str, kernel_source.Kernel]
    reasons: list[str]


def parse(record, cases: list[dict], state: dict[str, tuple[str, list[int]]]) -> Parsed:
    """Check an extraction's record. ``cases``: per signature, the layout of its inputs
    (channel.plan: {"inputs": [spec or {"value": v}]}); ``state``: the model's parameters and
    buffers (name -> (dtype, shape)). The record holds two programs per signature, of two calls
    on other inputs: they must be one program (``canonical``)."""
    if not isinstance(record, dict):
        return Parsed(
            [None] * len(cases), ["no record"] * len(cases), {}, ["the record is not an object"]
        )
    kernels_raw = record.get("kernels")
    if not isinstance(kernels_raw, dict) or len(kernels_raw) > MAX_KERNELS:
        kernels_raw = {}
    checked = kernel_source.check(
        {str(k): v for k, v in kernels_raw.items() if isinstance(v, dict)}
    )
    reasons = [why for k in checked.values() for why in k.reasons]
    # a kernel that calls a refused one is refused with it
    changed = True
    while changed:
        changed = False
        for k in checked.values():
            if not k.reasons and any(checked[c].reasons for c in k.calls if c in checked):
                k.reasons.append(f"kernel {k.name}: calls a refused kernel")
                changed = True
    raw_programs, raw_again = record.get("programs"), record.get("again")
    if not all(isinstance(r, list) and len(r) == len(cases) for r in (raw_programs, raw_again)):
        return Parsed([None] * len(cases), ["no program recorded"] * len(cases), checked, reasons)
    programs, errors = [], []
    for raw, again, case in zip(raw_programs, raw_again, cases, strict=True):
        try:
            program, second = (_one(r, case, state, checked) for r in (raw, again))
        except ProgramError as exc:
            programs.append(None)
            errors.append(str(exc))
            continue
        if canonical(program) != canonical(second):
            programs.append(None)
            errors.append(
                "a second call of the forward, on other inputs of the same shapes, recorded "
                "another program (a result kept from the first call, or host work that depends "
                "on the input values)"
            )
            continue
        refused = {
            a.name
            for s in program.steps
            if s["op"] == "launch"
            for a in s["alternatives"]
            if _refused(checked, a.kernel)
        }
        if refused:
            programs.append(None)
            errors.append(f"it launches refused kernel(s) {', '.join(sorted(refused))}")
            continue
        programs.append(program)
        errors.append(None)
    return Parsed(programs, errors, checked, reasons)


def _one(raw, case: dict, state: dict, checked: dict) -> Program:
    """One recorded call's program, or ProgramError saying why there is none."""
    if not isinstance(raw, dict):
        raise ProgramError("no program recorded")
    if raw.get("error"):
        raise ProgramError(str(raw["error"])[:2000])
    try:
        return _Parser(case, state, checked).program(raw)
    except ProgramError as exc:
        raise ProgramError(f"the recorded program is refused: {exc}") from None


def canonical(program: Program) -> str:
    """What a program does, independent of the order its storages were first seen in: storages
    numbered by first use in its steps and returns; an empty allocation and a constant (both
    uninitialised memory in the replay) alike."""
    numbers: dict[int, int] = {}

    def storage(i: int) -> list:
        s = program.storages[i]
        numbers.setdefault(i, len(numbers))
        if s["kind"] == "constant" or (s["kind"] == "alloc" and s["fill"] is None):
            what = ["uninitialised"]
        else:
            what = [s["kind"], s.get("index"), s.get("name"), s.get("dtype"), s.get("fill")]
        return [numbers[i], *what, s["nbytes"]]

    def tensor(i: int) -> list:
        t = program.tensors[i]
        return [storage(t["storage"]), t["dtype"], t["offset"], t["shape"], t["stride"]]

    def launch(a: Launch) -> list:
        args = {k: tensor(v["tensor"]) if "tensor" in v else v for k, v in sorted(a.args.items())}
        return [a.kernel, a.grid, args, a.num_warps, a.num_stages]

    steps = []
    for s in program.steps:
        if s["op"] == "launch":
            steps.append([launch(a) for a in s["alternatives"]])
        elif s["op"] == "fill":
            steps.append(["fill", tensor(s["tensor"]), s["value"]])
        else:
            steps.append(["copy", tensor(s["dst"]), tensor(s["src"])])
    returned = [tensor(t) for t in program.returned]
    return json.dumps([steps, returned, _shape(program.returns)])


def _shape(returns):
    """The nesting of what a program returns, tensors left out (compared by canonical)."""
    if "tensor" in returns:
        return "tensor"
    for kind in ("tuple", "list"):
        if kind in returns:
            return [kind, [_shape(r) for r in returns[kind]]]
    return returns


def _refused(checked: dict[str, kernel_source.Kernel], canonical: str) -> bool:
    return any(k.reasons for k in checked.values() if k.canonical == canonical)


def kernels_of(parsed: Parsed) -> list[kernel_source.Kernel]:
    """The kernels the programs launch, with every kernel they call, in a definition order."""
    by_canonical = {k.canonical: k for k in parsed.kernels.values()}
    wanted: list[str] = []
    todo = [
        a.kernel
        for p in parsed.programs
        if p is not None
        for s in p.steps
        if s["op"] == "launch"
        for a in s["alternatives"]
    ]
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.append(name)
        todo += [parsed.kernels[c].canonical for c in by_canonical[name].calls]
    return [k for k in parsed.kernels.values() if k.canonical in wanted]
