"""The extraction: runs one candidate in its own sandboxed process and records what its forward
did, as a program (program.py). Untrusted: everything here runs beside candidate code, which may
rewrite any of it; the parent believes none of what it reports, only checks it as data and
replays it (replay.py) on inputs this process never sees.

``main(job dir, device)``, in a child of the fork server (forkserver.py) or a fresh interpreter
(``python -m stillroom.kernels.extract <dir> <device>``). The parent wrote ``candidate.py``,
``job.pt`` (the init inputs, the reference's state dict, the layout of each input signature) and
``extract.bin`` (two draws of inputs of those signatures, from seeds the replay does not use).
The candidate's module is built, loaded with the reference's weights (and its buffers outside the
state dict, where ModelNew has one of that name and shape) and called twice in a row per
signature, once per draw, under a recorder (the parent requires both calls to record one
program):

- every Triton launch (``kernel[grid](...)``, through ``@triton.autotune`` and
  ``@triton.heuristics``) is recorded, never run: the kernel's source and the module-level names
  it reads, the grid, each argument and ``num_warps``/``num_stages`` (a keyword that names a
  parameter of the kernel is its argument, as Triton binds it, and sets the option too); an
  autotuned launch records each of its configs;
- an autotuner's hooks run where Triton runs them before a launch, and what they do is recorded as
  the host steps of that config (``before``): a ``Config(pre_hook=...)`` before its own launch,
  and ``reset_to_zero`` (or the autotuner's own ``pre_hook``, with ``reset_only=True``) when
  there are several configs to benchmark, as Triton resets them after benchmarking. A hook is
  candidate code like the rest: only what the recorder records of it (fills, copies of the
  program's tensors) reaches the replay, so a hook that computes an output with torch leaves
  nothing of it in the program;
- allocations, fills and copies (``torch.empty``/``zeros``/``ones``/``full`` and their ``_like``
  and ``new_`` forms, ``zero_``, ``fill_``, and ``contiguous``/``clone``/``reshape``/``copy_`` that
  copy) are recorded as steps; views need no record (a tensor is a view of its storage);
- any other tensor a launch or the return reaches is a constant: its size only (the replay holds
  no bytes of it).

The record goes into ``out.bin`` (the only file this process may write, laid out by the
parent). ``started()`` tells the caller that candidate code runs from now on: a failure
after it is the candidate's.

Inductor's cache directory is made before the sandbox's hook, in this job's own TMPDIR: importing
``torch._inductor`` (``from torch._inductor.runtime import triton_helpers``, the first line of
every module torch.compile writes) or ``torch._dynamo`` (which libraries reach through
``torch.compiler.disable``) makes it again, and the hook lets a mkdir of a directory that exists
through (it changes nothing). The hook stays as strict for every other path; the replay never
imports Inductor (kernel_source.py reads the helpers a kernel calls from the parent's own import).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import resource
import sys
import textwrap
import traceback
from pathlib import Path

from .. import sandbox
from . import channel

MEMORY_LIMIT_BYTES = 8 << 30  # address space on CPU: torch and triton take a few GiB of it
FILE_LIMIT_BYTES = 0  # this process writes no file: its output goes through out.bin's mapping
OUT = "out.bin"
MAGIC = b"SRPROG01"
RECORD_SPACE = 32 << 20  # the size of out.bin: the record's JSON
LAUNCH_OPTIONS = {
    "num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
    "launch_pdl", "debug", "instrumentation_mode", "fpsan_homomorphic_casts", "warmup", "grid",
}  # fmt: skip
ALLOC_FILLS = {
    "torch.empty": None, "torch.empty_like": None, "torch.empty_strided": None,
    "torch.Tensor.new_empty": None, "torch.Tensor.new_empty_strided": None,
    "torch.zeros": 0, "torch.zeros_like": 0, "torch.Tensor.new_zeros": 0,
    "torch.ones": 1, "torch.ones_like": 1, "torch.Tensor.new_ones": 1,
    "torch.full": "arg1", "torch.full_like": "arg1", "torch.Tensor.new_full": "arg1",
}  # fmt: skip
COPIES = {"torch.Tensor.contiguous", "torch.Tensor.clone", "torch.clone", "torch.Tensor.reshape",
          "torch.reshape", "torch.Tensor.flatten", "torch.flatten"}  # fmt: skip


def read_out(path: Path) -> tuple[dict | None, str | None]:
    """(record, why not) from an out.bin the extraction wrote (or did not)."""
    return channel.Report.read(path, MAGIC, RECORD_SPACE)


class _Recorder:
    """The program of one forward, as it runs."""

    def __init__(self, kernels: _Kernels):
        self.kernels = kernels
        self.storages: list[dict] = []
        self.roots: dict[int, int] = {}  # storage data_ptr -> index
        self.keep: list = []  # every registered storage stays alive: no address is reused
        self.steps: list[dict] = []
        self.muted = 0  # the recorder's own torch calls
        self.choices: list[list] | None = None  # an autotuner's configs, while it runs them

    def root(self, storage, entry: dict) -> int:
        self.storages.append({**entry, "nbytes": storage.nbytes()})
        index = len(self.storages) - 1
        if storage.nbytes():
            self.roots[storage.data_ptr()] = index
        self.keep.append(storage)
        return index

    def storage_of(self, t) -> int:
        storage = t.untyped_storage()
        index = self.roots.get(storage.data_ptr()) if storage.nbytes() else None
        if index is not None and self.storages[index]["nbytes"] == storage.nbytes():
            return index
        # a tensor the program did not make: the replay holds no bytes of it (program.py)
        return self.root(storage, {"kind": "constant"})

    def tensor(self, t) -> dict:
        return {
            "storage": self.storage_of(t),
            "dtype": str(t.dtype).removeprefix("torch."),
            "offset": t.storage_offset(),
            "shape": list(t.shape),
            "stride": list(t.stride()),
        }

    def known(self, t) -> bool:
        s = t.untyped_storage()
        return bool(s.nbytes()) and s.data_ptr() in self.roots

    def value(self, v, what: str) -> dict:
        import torch
        import triton.language as tl

        if isinstance(v, tl.constexpr):
            v = v.value
        if isinstance(v, torch.Tensor):
            return {"tensor": self.tensor(v)}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"value": v}
        if isinstance(v, tl.dtype):
            return {"dtype": v.name}
        raise TypeError(
            f"{what} is a {type(v).__name__}: a replay passes tensors, numbers and dtypes"
        )

    def returns(self, v) -> dict:
        import torch

        if isinstance(v, torch.Tensor):
            return {"tensor": self.tensor(v)}
        if type(v) in (tuple, list):
            return {type(v).__name__: [self.returns(x) for x in v]}
        if v is None or isinstance(v, (bool, int, float)):
            return {"value": v}
        raise TypeError(f"the forward returned a {type(v).__name__}")

    def launch(self, jit, args: tuple, kwargs: dict) -> None:
        import triton.language as tl

        fn = jit.fn
        params = inspect.signature(fn).parameters
        # a keyword naming a parameter is its argument (the fused-softmax tutorial's num_stages)
        given = {
            k: v
            for k, v in kwargs.items()
            if k != "grid" and (k in params or k not in LAUNCH_OPTIONS)
        }
        bound = inspect.signature(fn).bind(*args, **given)
        bound.apply_defaults()
        grid = kwargs["grid"]
        if callable(grid):
            grid = grid(dict(bound.arguments))
        grid = [g.value if isinstance(g, tl.constexpr) else g for g in tuple(grid)]
        record = {
            "kernel": self.kernels.add(jit),
            "grid": [int(g) for g in grid],
            "args": {
                name: self.value(value, f"argument {name} of {fn.__name__}")
                for name, value in bound.arguments.items()
                if name in params
            },
            "num_warps": kwargs.get("num_warps") or 4,
            "num_stages": kwargs.get("num_stages") or 3,
        }
        if self.choices is not None:
            self.choices[-1].append(record)
        else:
            self.steps.append({"op": "launch", "alternatives": [record]})

    def hooked(self, hook, *args, **kwargs) -> list[dict]:
        """The steps an autotuner's hook takes, recorded apart from the forward's (a launch too:
        a step, not a config of the autotuner, which the parent refuses in a hook)."""
        outer, choices = self.steps, self.choices
        self.steps, self.choices = [], None
        try:
            hook(*args, **kwargs)
            return self.steps
        finally:
            self.steps, self.choices = outer, choices

    def program(self) -> dict:
        return {"storages": self.storages, "steps": self.steps}


class _Kernels:
    """The @triton.jit functions the program launches or calls, by id: source and what each
    module-level name it reads is."""

    def __init__(self):
        self.ids: dict[int, str] = {}
        self.records: dict[str, dict] = {}

    def add(self, jit) -> str:
        fn = getattr(jit, "fn", jit)
        key = id(fn)
        if key in self.ids:
            return self.ids[key]
        kid = f"{len(self.ids)}:{fn.__name__}"
        self.ids[key] = kid
        try:
            source = textwrap.dedent(inspect.getsource(fn))
        except (OSError, TypeError) as exc:
            self.records[kid] = {"name": fn.__name__, "source": None, "error": str(exc)}
            return kid
        record = {"name": fn.__name__, "source": source, "globals": {}}
        self.records[kid] = record
        for name in _free_names(source):
            if name in fn.__globals__:
                record["globals"][name] = self.describe(fn.__globals__[name])
        return kid

    def describe(self, value) -> dict:
        import types

        import triton.language as tl
        from triton.runtime.jit import KernelInterface

        if isinstance(value, types.ModuleType):
            return {"module": value.__name__}
        module = getattr(value, "__module__", None) or ""
        if module.startswith("triton.language") and hasattr(value, "__name__"):
            return {"language": f"{module}.{value.__name__}"}
        if isinstance(value, KernelInterface) or hasattr(value, "fn"):
            inner = value
            while hasattr(inner, "fn") and not inspect.isfunction(inner):
                inner = inner.fn
            if inspect.isfunction(inner):
                return {"kernel": self.add(inner)}
        if isinstance(value, tl.constexpr):
            value = value.value
        if isinstance(value, tl.dtype):
            return {"dtype": value.name}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        return {"other": type(value).__name__}


def _free_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            names.append(node.id)
    return list(dict.fromkeys(names))


_recorder: list[_Recorder] = []


def _patch_launches() -> None:
    """Record launches instead of running them: the JIT and interpreted kernels, and an autotuner
    (each config, no benchmark)."""
    from triton.runtime import autotuner, jit

    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # a triton without the interpreter
        pass

    def run(self, *args, grid, warmup=False, **kwargs):
        if warmup or not _recorder:
            return None
        _recorder[-1].launch(self, args, {**kwargs, "grid": grid})
        return None

    for cls in classes:
        cls.run = run

    def tuned(self, *args, **kwargs):
        recorder = _recorder[-1]
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        try:
            configs = self.prune_configs(kwargs)
        except Exception:  # noqa: BLE001 - the candidate's pruning: every config then
            configs = self.configs
        outer = recorder.choices
        recorder.choices = [*(outer or []), []]
        try:
            for config in configs:
                nargs = {**self.nargs, **kwargs, **config.all_kwargs()}
                before = []
                if len(configs) > 1:  # Triton benchmarks, then resets (reset_to_zero)
                    before += recorder.hooked(self.pre_hook, nargs, reset_only=True)
                if config.pre_hook is not None:
                    before += recorder.hooked(config.pre_hook, nargs)
                made = len(recorder.choices[-1])
                self.fn.run(*args, **kwargs, **config.all_kwargs())
                for alternative in recorder.choices[-1][made:]:
                    alternative["before"] = before + alternative.get("before", [])
            alternatives = recorder.choices[-1]
        finally:
            recorder.choices = outer
        if outer is not None:
            outer[-1].extend(alternatives)
        else:
            recorder.steps.append({"op": "launch", "alternatives": alternatives})
        return None

    autotuner.Autotuner.run = tuned


def _mode():
    """The recorder of host operations: allocations, fills and copies (views need none)."""
    import torch
    from torch.overrides import TorchFunctionMode, resolve_name

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if not _recorder or _recorder[-1].muted:
                return out
            recorder = _recorder[-1]
            recorder.muted += 1
            try:
                name = resolve_name(func) or ""
                if name in ALLOC_FILLS and isinstance(out, torch.Tensor):
                    fill = ALLOC_FILLS[name]
                    if fill == "arg1":
                        fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
                        fill = fill if isinstance(fill, (int, float)) else None
                    if isinstance(fill, bool):
                        fill = int(fill)
                    if out.untyped_storage().nbytes():
                        recorder.root(
                            out.untyped_storage(),
                            {
                                "kind": "alloc",
                                "dtype": str(out.dtype).removeprefix("torch."),
                                "fill": fill,
                            },
                        )
                elif name in ("torch.Tensor.zero_", "torch.Tensor.fill_") and args:
                    target = args[0]
                    value = 0 if name.endswith("zero_") else (args[1] if len(args) > 1 else None)
                    if isinstance(value, (int, float)) and recorder.known(target):
                        recorder.steps.append(
                            {"op": "fill", "tensor": recorder.tensor(target), "value": value}
                        )
                elif name in COPIES and args and isinstance(out, torch.Tensor):
                    src = args[0]
                    copied = out.untyped_storage().data_ptr() != src.untyped_storage().data_ptr()
                    if copied and recorder.known(src) and out.untyped_storage().nbytes():
                        dtype = str(out.dtype).removeprefix("torch.")
                        recorder.root(
                            out.untyped_storage(), {"kind": "alloc", "dtype": dtype, "fill": None}
                        )
                        recorder.steps.append(
                            {"op": "copy", "dst": recorder.tensor(out), "src": recorder.tensor(src)}
                        )
                elif name == "torch.Tensor.copy_" and len(args) > 1:
                    dst, src = args[0], args[1]
                    if (
                        isinstance(src, torch.Tensor)
                        and recorder.known(dst)
                        and recorder.known(src)
                        and dst.numel() == src.numel()
                        and dst.dtype == src.dtype
                    ):
                        recorder.steps.append(
                            {"op": "copy", "dst": recorder.tensor(dst), "src": recorder.tensor(src)}
                        )
            finally:
                recorder.muted -= 1
            return out

    return Record()


def _to(value, device):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def main(scratch: str, device: str, started=None) -> None:
    """Record the candidate in ``scratch`` (its job directory) and end the process: never
    returns. ``started()``, if given, is called just before candidate code runs."""
    work = Path(scratch)
    sandbox.limit(
        memory_bytes=MEMORY_LIMIT_BYTES + 2 * (work / channel.EXTRACT).stat().st_size
        if device == "cpu"
        else None
    )
    import torch
    import triton  # noqa: F401 - imported before the audit hook: its own start is not audited

    # Inductor's cache directory, made in this job's TMPDIR before the hook (see the docstring);
    # named through the variable Inductor reads: importing torch._inductor here would slow every job
    cache = os.path.join(os.environ.get("TMPDIR", "/tmp"), "torchinductor")
    os.makedirs(cache, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    if torch.distributed.is_available():
        # torch's own module, whose import loads libc with ctypes (refused by the audit hook); a
        # library reaches it through torch.distributed.checkpoint (Liger-Kernel, via torchao)
        import torch.distributed.elastic.multiprocessing.redirects  # noqa: F401

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    job = torch.load(work / "job.pt", weights_only=True, mmap=True)
    data = channel.Mapping(work / channel.EXTRACT, writable=False)
    out = channel.Report(work / OUT, MAGIC, RECORD_SPACE)
    kernels = _Kernels()
    record: dict = {"stage": "import", "error": None, "programs": [], "kernels": kernels.records}
    _patch_launches()
    mode = _mode()
    # no process may be started (a kernel-enforced filter), nor any file written
    sandbox.no_new_processes()
    sandbox.guard(box=None)
    # the hard limit too: candidate code may raise a soft limit up to it
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT_BYTES, FILE_LIMIT_BYTES))
    if started is not None:
        started()
    try:
        spec = importlib.util.spec_from_file_location("candidate", work / "candidate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        record["stage"] = "init"
        torch.manual_seed(job["seed"])
        model = module.ModelNew(*job["init_inputs"]).to(device)
        state = {k: v.to(device) for k, v in job["state_dict"].items()}
        own = set(model.state_dict())
        if own != set(state):
            raise ValueError(
                "ModelNew's parameters and buffers differ from Model's: "
                f"missing {sorted(set(state) - own)}, unexpected {sorted(own - set(state))}"
            )
        model.load_state_dict(state)
        # the reference's buffers outside its state dict: where ModelNew has one of the same
        # name and shape, it holds the reference's values and is replayed as that buffer
        buffers = {}
        for name, value in job["buffers"].items():
            mine = dict(model.named_buffers()).get(name)
            if mine is not None and mine.shape == value.shape and mine.dtype == value.dtype:
                with torch.no_grad():
                    mine.copy_(value)
                buffers[name] = mine
        record["stage"] = "forward"
        # each signature twice in a row, on two draws (as a caller that checks a model calls
        # it): both calls must record one program
        record["programs"], record["again"] = [], []
        for first, second in zip(job["signatures"], job["again"], strict=True):
            for key, layout in (("programs", first), ("again", second)):
                record[key].append(_call(model, layout, data, kernels, mode, buffers, device))
        record["stage"] = "done"
    except BaseException as exc:  # noqa: BLE001 - any failure of candidate code is a result
        record["error"] = _error(exc)
    out.finish(record)
    # no candidate code after the record: skip finalizers and atexit, which could rewrite it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _call(model, layout: dict, data, kernels, mode, buffers: dict, device: str) -> dict:
    """The program of one forward of ``model`` on the inputs at ``layout``, or its error."""
    import torch

    recorder = _Recorder(kernels)
    recorder.muted += 1
    for name, t in [*model.state_dict().items(), *buffers.items()]:
        if t.untyped_storage().data_ptr() not in recorder.roots:
            recorder.root(t.untyped_storage(), {"kind": "state", "name": name})
    inputs = [_to(x, device) for x in data.inputs(layout)]
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in recorder.roots:
            recorder.root(x.untyped_storage(), {"kind": "input", "index": i})
    recorder.muted -= 1
    _recorder.append(recorder)
    try:
        with torch.no_grad(), mode:
            result = model(*inputs)
        recorder.muted += 1
        return {**recorder.program(), "returns": recorder.returns(result)}
    except BaseException as exc:  # noqa: BLE001 - the candidate's failure, per signature
        return {"error": _error(exc)}
    finally:
        _recorder.pop()


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]


if __name__ == "__main__":
    from .isolation import limit_cpu

    limit_cpu(float(sys.argv[3]))
    main(sys.argv[1], sys.argv[2], started=lambda: print("started", flush=True))
