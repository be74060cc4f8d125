"""The replay: a trusted runner for a candidate's checked program (program.py). It runs in a
process that never ran candidate code (a fresh child of the fork server, or a fresh interpreter),
in its own sandbox, and executes only what the parent wrote: the canonical source of the checked
kernels (kernel_source.py), in a namespace holding ``tl``, ``triton`` and a few builtins, and the
program's steps as data.

``main(job dir, device)``. The parent wrote ``replay.json`` (the programs, and per case which
program and where its inputs and outputs lie in the channel), ``kernels.py`` and its instrumented
twin ``kernels_analysis.py``, ``state.pt`` (the reference's weights), ``constants.bin`` (the bytes
of each program's constants) and ``channel.bin`` with every case's inputs: the trials and
generated cases, drawn from a seed the candidate never saw. For each case the program's storages
are built (inputs are their channel regions on CPU, so a kernel that writes an input is seen doing
it), its steps run in order and what it returns is copied into the case's output regions; the
parent compares. The result (per case: None or the error; the analysis; on a GPU the program's
time) goes into ``result.bin``.

On CPU (Triton's interpreter) every load, store and atomic of a kernel is checked against the
buffers of its launch before it happens: an access outside them is the kernel's error, not a
read or write of this process's memory.

The analysis (the launch rules' values, launch_checks.py): before the first case runs each distinct
launch (every config of an autotuned one), its first and last program instances run in the
interpreter on copies of its arguments with the instrumented source: every ``tl.arange`` length
and block shape, the operations each instance executes (a loop whose bounds are run-time values
counted once, unrolled ones every iteration, through helpers with their actual constexprs), and
for each load and store the addresses of neighbouring lanes along each axis (coalescing).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

from .. import sandbox
from . import channel, kernel_source

RESULT = "result.bin"
RESULT_BYTES = 16 << 20
RESULT_MAGIC = b"SRREPL01"
MEMORY_LIMIT_BYTES = 8 << 30
MAX_ACCESS_SITES = 256
WARP, SECTOR = 32, 32  # lanes that access memory together; bytes a memory transaction moves
# what Triton's compiler does on a GPU (ptxas): the kernels it compiles are checked sources
GPU_EVENTS = {"subprocess.Popen", "_posixsubprocess.fork_exec", "os.posix_spawn"}


def read_result(path: Path) -> tuple[dict | None, str | None]:
    result, _, why = channel.Report.read(path, RESULT_MAGIC, RESULT_BYTES)
    return result, why


class ReplayError(Exception):
    """A step of the program failed: the candidate's failure."""


class _Memory:
    """Triton's interpreter reaches memory through one native module: this proxy checks each
    access against the buffers of the launch that runs, and tells the analysis about it."""

    def __init__(self, real):
        self.real = real
        self.starts = self.ends = None
        self.analysis: Analysis | None = None

    def __getattr__(self, name):
        return getattr(self.real, name)

    def allow(self, tensors) -> None:
        import numpy as np

        spans = sorted(
            {
                (
                    t.untyped_storage().data_ptr(),
                    t.untyped_storage().data_ptr() + t.untyped_storage().nbytes(),
                )
                for t in tensors
                if t.untyped_storage().nbytes()
            }
        )
        self.starts = np.array([s for s, _ in spans], dtype=np.uint64)
        self.ends = np.array([e for _, e in spans], dtype=np.uint64)

    def check(self, what: str, ptrs, mask, itemsize: int) -> None:
        import numpy as np

        addresses = np.asarray(ptrs, dtype=np.uint64)
        live = (
            addresses
            if mask is None
            else addresses[np.broadcast_to(np.asarray(mask, bool), addresses.shape)]
        )
        if self.analysis is not None:
            self.analysis.access(what, addresses, mask, itemsize)
        if self.starts is None or live.size == 0:
            return
        index = np.searchsorted(self.starts, live, side="right").astype(np.int64) - 1
        inside = index >= 0
        ok = inside.copy()
        ok[inside] = live[inside] + np.uint64(itemsize) <= self.ends[index[inside]]
        if not ok.all():
            raise ReplayError(
                f"{_site()}: {what} of {int((~ok).sum())} element(s) outside every buffer passed "
                "to the launch"
            )

    def load(self, ptrs, mask, other, dtype):
        import numpy as np

        self.check("tl.load", ptrs, mask, np.dtype(dtype).itemsize)
        return self.real.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        self.check("tl.store", ptrs, mask, value.itemsize)
        return self.real.store(ptrs, value, mask)

    def atomic_rmw(self, op, ptrs, value, mask, sem):
        self.check("an atomic", ptrs, mask, value.itemsize)
        return self.real.atomic_rmw(op, ptrs, value, mask, sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        self.check("an atomic", ptrs, None, value.itemsize)
        return self.real.atomic_cas(ptrs, cmp, value, sem)


_KERNEL_FILES: set[str] = set()


def _site() -> str:
    """The kernel source line running now: 'kernel name: source text'."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename not in _KERNEL_FILES:
        frame = frame.f_back
    if frame is None:
        return "a kernel"
    import linecache

    text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"kernel {frame.f_code.co_name.split('_', 1)[-1]}: {text}"


class Analysis:
    """The launch rules' values, from the instances of a launch that run instrumented."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.recording = False
        self.count = 0
        self.max_count = 0
        self.muted: set[int] = set()
        self.iterations: dict[int, int] = {}
        self.sizes: set[int] = set()
        self.sites: dict[tuple, dict] = {}

    def instance(self) -> None:
        self.max_count = max(self.max_count, self.count)
        self.count = 0
        self.muted.clear()
        self.iterations.clear()

    def finish(self) -> dict:
        self.instance()
        return {
            "instructions": self.max_count,
            "sizes": sorted(self.sizes),
            "accesses": list(self.sites.values())[:MAX_ACCESS_SITES],
        }

    # called by the instrumented source (kernel_source.instrument)
    def op_count(self, n: int) -> None:
        if self.recording and not self.muted:
            self.count += n

    def loop(self, ident: int, kind: str, *args, **kwargs):
        import triton.language as tl

        bounds = [*args, kwargs.get("step")] if "step" in kwargs else list(args)
        runtime = kind != "static" and any(isinstance(b, tl.tensor) for b in bounds)
        values = [int(b.value if isinstance(b, tl.constexpr) else b) for b in args]
        step = kwargs.get("step")
        if step is not None:
            values.append(int(step.value if isinstance(step, tl.constexpr) else step))
        for n, v in enumerate(range(*values)):
            if runtime and n == 1:
                self.muted.add(ident)
            yield v

    def loop_end(self, ident: int) -> None:
        self.muted.discard(ident)
        self.iterations.pop(ident, None)

    def iteration(self, ident: int) -> None:
        n = self.iterations.get(ident, 0) + 1
        self.iterations[ident] = n
        if n > 1:
            self.muted.add(ident)

    def size(self, n) -> None:
        if self.recording:
            self.sizes.add(int(n))

    def access(self, what: str, addresses, mask, itemsize: int) -> None:
        """Per access site and axis: the memory sectors (32 bytes) the active lanes touch when
        lanes are laid out along that axis (a warp: 32 consecutive lanes), and the fewest sectors
        their distinct addresses could take. Triton lays lanes out along the axis that is
        contiguous; the rules take the best axis."""
        import numpy as np

        if not self.recording:
            return
        site = _site()
        entry = self.sites.setdefault((what, site), {"what": what, "site": site, "axes": {}})
        a = np.asarray(addresses).astype(np.int64)
        m = (
            np.ones(a.shape, bool)
            if mask is None
            else np.broadcast_to(np.asarray(mask, bool), a.shape)
        )
        axes = [axis for axis in range(a.ndim) if a.shape[axis] > 1]
        if not axes:
            entry["axes"].setdefault("scalar", [0, 0])
            return
        for axis in axes:
            lanes = np.moveaxis(a, axis, -1).reshape(-1)
            active = np.moveaxis(m, axis, -1).reshape(-1)
            counts = entry["axes"].setdefault(str(axis), [0, 0])
            for start in range(0, lanes.size, WARP):
                warp = np.unique(lanes[start : start + WARP][active[start : start + WARP]])
                if warp.size == 0:
                    continue
                sectors = np.unique(
                    np.concatenate([warp // SECTOR, (warp + itemsize - 1) // SECTOR])
                )
                counts[0] += int(sectors.size)
                counts[1] += -(-int(warp.size) * itemsize // SECTOR)


class _Runner:
    def __init__(self, work: Path, device: str):
        import torch
        import triton
        import triton.language as tl

        self.work, self.device = work, device
        self.torch, self.triton, self.tl = torch, triton, tl
        self.job = json.loads((work / "replay.json").read_text())
        self.state = torch.load(work / "state.pt", weights_only=True)
        self.constants = (work / "constants.bin").open("rb")
        self.dtypes = kernel_source.language().dtypes
        self.memory: _Memory | None = None
        self.analysis = Analysis()
        for name in self.job.get("modules", []):  # submodules the kernels reach (libdevice)
            if name.startswith(kernel_source.LANGUAGE + "."):
                importlib.import_module(name)
        self.kernels = self._load("kernels.py", analysis=False)
        self.analysed = self._load("kernels_analysis.py", analysis=True)

    def _load(self, name: str, analysis: bool) -> dict:
        """The kernels of a canonical source file, each wrapped for launching: compiled by Triton
        (or interpreted on CPU), or interpreted with the analysis's counters."""
        import importlib.util

        path = self.work / name
        _KERNEL_FILES.add(str(path))
        spec = importlib.util.spec_from_file_location(f"stillroom_replay_{name[:-3]}", path)
        module = importlib.util.module_from_spec(spec)
        module.__dict__.update(__builtins__=_builtins(self.tl), tl=self.tl, triton=self.triton)
        if analysis:
            a = self.analysis
            module.__dict__.update(
                {
                    kernel_source.COUNT: a.op_count,
                    kernel_source.LOOP: a.loop,
                    kernel_source.LOOP_END: a.loop_end,
                    kernel_source.ITERATION: a.iteration,
                }
            )
        spec.loader.exec_module(module)
        names = [n for n, v in vars(module).items() if inspect.isfunction(v) and n.startswith("k")]
        if analysis:
            from triton.runtime.interpreter import InterpretedFunction

            wrap = InterpretedFunction
        else:
            wrap = self.triton.jit
        for n in names:
            setattr(module, n, wrap(getattr(module, n)))
        return {n: getattr(module, n) for n in names}

    # -- the storages and tensors of one case
    def materialize(self, program: dict, inputs: list) -> list:
        torch = self.torch
        storages = []
        for s in program["storages"]:
            kind, nbytes = s["kind"], s["nbytes"]
            if kind == "input":
                storage = inputs[s["index"]].untyped_storage()
            elif kind == "state":
                storage = self.state[s["name"]].to(self.device, copy=True).untyped_storage()
            elif kind == "alloc":
                raw = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                if s["fill"] is None:
                    raw.fill_(0xFF)  # NaN in every float format: no element passes unwritten
                else:
                    dtype = getattr(torch, s["dtype"])
                    size = torch.empty(0, dtype=dtype).element_size()
                    raw.zero_()
                    raw[: nbytes // size * size].view(dtype).fill_(s["fill"])
                storage = raw.untyped_storage()
            else:  # constant
                self.constants.seek(self.job["constants_base"] + s["offset"])
                data = bytearray(self.constants.read(nbytes))
                raw = (
                    torch.frombuffer(data, dtype=torch.uint8)
                    if nbytes
                    else torch.empty(0, dtype=torch.uint8)
                )
                storage = raw.to(self.device).untyped_storage()
            if storage.nbytes() < nbytes:
                raise ReplayError(f"a {kind} storage holds {storage.nbytes()} bytes, not {nbytes}")
            storages.append(storage)
        tensors = []
        for t in program["tensors"]:
            dtype = getattr(torch, t["dtype"])
            view = torch.empty(0, dtype=dtype, device=self.device)
            view.set_(storages[t["storage"]], t["offset"], t["shape"], t["stride"])
            tensors.append(view)
        return tensors

    def arguments(self, launch: dict, tensors: list, interpreted: bool | None = None) -> dict:
        """A launch's keyword arguments; ``interpreted`` (default: on CPU) passes each float of a
        run-time parameter as the fp32 scalar Triton's compiler makes of it."""
        if interpreted is None:
            interpreted = self.device == "cpu"
        fn = self.kernels[launch["kernel"]].fn
        runtime = {
            n
            for n, p in inspect.signature(fn).parameters.items()
            if p.annotation is not self.tl.constexpr
        }
        out = {}
        for name, arg in launch["args"].items():
            if "tensor" in arg:
                out[name] = tensors[arg["tensor"]]
            elif "dtype" in arg:
                out[name] = getattr(self.tl, self.dtypes[arg["dtype"]])
            elif interpreted and name in runtime and type(arg["value"]) is float:
                out[name] = interpreted_float(self.tl, arg["value"])
            else:
                out[name] = arg["value"]
        return out

    def launch(self, launch: dict, tensors: list) -> None:
        kwargs = self.arguments(launch, tensors)
        if self.memory is not None:
            self.memory.allow([v for v in kwargs.values() if isinstance(v, self.torch.Tensor)])
        kernel = self.kernels[launch["kernel"]]
        try:
            kernel[tuple(launch["grid"])](
                **kwargs, num_warps=launch["num_warps"], num_stages=launch["num_stages"]
            )
        except ReplayError:
            raise
        except Exception as exc:  # noqa: BLE001 - the kernel's failure (compile, interpreter)
            cause = exc.__cause__ if isinstance(exc.__cause__, ReplayError) else None
            if cause is not None:
                raise cause from None
            raise ReplayError(f"launch of {launch['name']}: {_message(exc)}") from None

    def analyse(self, launch: dict, tensors: list) -> dict:
        """The launch rules' values of one launch: its first and last program instances,
        interpreted with the instrumented source on copies of its arguments."""
        from triton.runtime import interpreter

        torch = self.torch
        kwargs = self.arguments(launch, tensors, interpreted=True)
        copies: dict[int, object] = {}
        for name, value in list(kwargs.items()):
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                key = storage.data_ptr()
                if key not in copies:
                    copies[key] = storage.cpu() if storage.device.type != "cpu" else storage.clone()
                view = torch.empty(0, dtype=value.dtype)
                view.set_(copies[key], value.storage_offset(), value.shape, value.stride())
                kwargs[name] = view
        grid = list(launch["grid"]) + [1] * (3 - len(launch["grid"]))
        last = tuple(g - 1 for g in grid)
        instances = [(0, 0, 0)] + ([last] if last != (0, 0, 0) else [])
        if 0 in grid:
            instances = []
        ifn = self.analysed[launch["kernel"]]
        fn = ifn.rewrite()
        executor = interpreter.GridExecutor(fn, ifn.arg_names, tuple(grid))
        argspec = inspect.getfullargspec(fn)
        kwargs = {k: v for k, v in kwargs.items() if k in argspec.args}
        builder = interpreter.interpreter_builder
        make_range, splat = builder.create_make_range, builder.create_splat
        analysis = self.analysis
        analysis.reset()

        def counted_range(ret_ty, start, stop):
            analysis.size(stop - start)
            return make_range(ret_ty, start, stop)

        def counted_splat(ret_ty, arg):
            for d in getattr(ret_ty, "shape", ()):
                analysis.size(d.value if isinstance(d, self.tl.constexpr) else d)
            return splat(ret_ty, arg)

        memory = self._memory()
        previous = memory.analysis
        memory.allow([v for v in kwargs.values() if isinstance(v, torch.Tensor)])
        memory.analysis = analysis
        builder.create_make_range, builder.create_splat = counted_range, counted_splat
        scope = interpreter._patch_lang(fn)
        try:
            args = inspect.getcallargs(fn, **kwargs)
            args = {
                n: a if n in executor.constexprs else interpreter._implicit_cvt(a)
                for n, a in args.items()
            }
            builder.set_grid_dim(*grid)
            for x, y, z in instances:
                builder.set_grid_idx(x, y, z)
                analysis.instance()
                analysis.recording = True
                try:
                    fn(**args)
                finally:
                    analysis.recording = False
        except ReplayError:
            raise
        except Exception as exc:  # noqa: BLE001 - the kernel's failure, as in the launch itself
            raise ReplayError(f"launch of {launch['name']}: {_message(exc)}") from None
        finally:
            scope.restore()
            builder.create_make_range, builder.create_splat = make_range, splat
            memory.analysis = previous
        return analysis.finish()

    def _memory(self) -> _Memory:
        """The bounds-checking proxy around the interpreter's memory access, installed once."""
        if self.memory is None:
            from triton.runtime import interpreter

            self.memory = _Memory(interpreter._interpreter)
            interpreter._interpreter = self.memory
        return self.memory

    def run(self, program: dict, inputs: list, analyse: bool, result: dict, index: int):
        """Run one case's program; its returned value (tensors and nesting)."""
        tensors = self.materialize(program, inputs)
        self.execute(program, tensors, analyse, result, index)
        return _returned(program["returns"], tensors)

    def execute(self, program: dict, tensors: list, analyse: bool, result: dict, index: int):
        for i, step in enumerate(program["steps"]):
            if step["op"] == "fill":
                tensors[step["tensor"]].fill_(step["value"])
            elif step["op"] == "copy":
                dst, src = tensors[step["dst"]], tensors[step["src"]]
                dst.copy_(src.reshape(dst.shape))
            else:
                alternatives = step["alternatives"]
                if analyse:
                    for j, alt in enumerate(alternatives):
                        key = json.dumps(
                            [alt["kernel"], alt["constexprs"], alt["num_warps"]], sort_keys=True
                        )
                        if key not in result["analysed"]:
                            result["analysed"][key] = {
                                "program": index, "step": i, "alternative": j,
                                **self.analyse(alt, tensors),
                            }  # fmt: skip
                choice = self.choose(alternatives, tensors) if len(alternatives) > 1 else 0
                result["chosen"][f"{index}:{i}"] = choice
                self.launch(alternatives[choice], tensors)

    def choose(self, alternatives: list, tensors: list) -> int:
        """Which config of an autotuned launch runs: the first on CPU; on a GPU the fastest, timed
        here on copies of its arguments."""
        if not self.device.startswith("cuda"):
            return 0
        torch = self.torch
        best, best_s = 0, math.inf
        for j, alt in enumerate(alternatives):
            kwargs = self.arguments(alt, tensors)
            scratch = {
                k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
            }
            kernel = self.kernels[alt["kernel"]][tuple(alt["grid"])]
            try:
                kernel(**scratch, num_warps=alt["num_warps"], num_stages=alt["num_stages"])
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(5):
                    kernel(**scratch, num_warps=alt["num_warps"], num_stages=alt["num_stages"])
                torch.cuda.synchronize()
                seconds = (time.perf_counter() - start) / 5
            except Exception:  # noqa: BLE001 - a config that fails is not chosen
                continue
            if seconds < best_s:
                best, best_s = j, seconds
        return best


# Builtins that would read a run-time value into Python (Triton's compiler refuses that; its
# interpreter would let a kernel compute in Python): on a Triton tensor they raise.
SCALAR_ONLY = ("int", "float", "bool", "min", "max")


def interpreted_float(tl, value: float):
    """A float argument as Triton's compiler types it, an fp32 scalar: Triton's interpreter passes
    it on as a Python float (only ints become tensors), on which ``eps.to(tl.float32)`` fails and
    arithmetic runs in float64."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    return tl.tensor(TensorHandle(np.array([value], dtype=np.float32), tl.float32), tl.float32)


def _builtins(tl) -> dict:
    import builtins

    def strict(name: str):
        real = getattr(builtins, name)

        def call(*args, **kwargs):
            if any(isinstance(a, tl.tensor) for a in args):
                raise TypeError(
                    f"{name}() of a Triton tensor reads a run-time value into Python, which "
                    "Triton's compiler refuses"
                )
            return real(*args, **kwargs)

        return call

    return {
        n: strict(n) if n in SCALAR_ONLY else getattr(builtins, n) for n in kernel_source.BUILTINS
    }


def _returned(spec, tensors):
    if "tensor" in spec:
        return tensors[spec["tensor"]]
    if "tuple" in spec:
        return tuple(_returned(s, tensors) for s in spec["tuple"])
    if "list" in spec:
        return [_returned(s, tensors) for s in spec["list"]]
    return spec["value"]


def _message(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text[-1500:]


def main(scratch: str, device: str, started=None) -> None:
    """Replay the programs in ``scratch`` on every case and end the process: never returns."""
    work = Path(scratch)
    # a GPU compile's cache: in this job's private /tmp, never a cache another job wrote
    os.environ["TRITON_CACHE_DIR"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "triton-cache")
    data_bytes = (work / channel.FILE).stat().st_size
    sandbox.limit(memory_bytes=MEMORY_LIMIT_BYTES + 3 * data_bytes if device == "cpu" else None)
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    result: dict = {"cases": [], "analysed": {}, "chosen": {}, "seconds": None, "error": None}
    written = channel.Report(work / RESULT, RESULT_MAGIC, RESULT_BYTES)
    try:
        runner = _Runner(work, device)
        if device == "cpu":
            runner._memory()
    except Exception as exc:  # noqa: BLE001 - the replay could not even start: the harness's
        result["error"] = f"harness: {_message(exc)}"
        written.finish(result)
        os._exit(0)
    mapping = channel.Mapping(work / channel.FILE, writable=True)
    if device == "cpu":
        sandbox.no_new_processes()
        sandbox.guard(box=None)
    else:  # a GPU compile writes Triton's cache and runs ptxas: checked sources only, no Python
        sandbox.guard(
            box=os.environ.get("TMPDIR", "/tmp"), allow=lambda event, args: event in GPU_EVENTS
        )
    if started is not None:
        started()
    seen_programs: set[int] = set()
    first_inputs = None
    for case in runner.job["cases"]:
        index = case["program"]
        program = runner.job["programs"][index]
        sent = mapping.inputs(case["layout"])
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in sent]
        try:
            with torch.no_grad():
                out = runner.run(program, inputs, index not in seen_programs, result, index)
                if device != "cpu":
                    torch.cuda.synchronize()
            seen_programs.add(index)
            why = channel.put(mapping, case["layout"], out)
        except ReplayError as exc:
            why = str(exc)
        except Exception as exc:  # noqa: BLE001 - a host step of the program failed
            why = f"the program failed: {_message(exc)}"
        if device != "cpu":  # the inputs as the program left them
            for s, x in zip(sent, inputs, strict=True):
                if isinstance(s, torch.Tensor):
                    s.copy_(x)
        if first_inputs is None and why is None:
            first_inputs = case
        result["cases"].append(why)
    if device.startswith("cuda") and runner.job.get("time_reps") and first_inputs is not None:
        result["seconds"] = _time(runner, first_inputs, mapping, runner.job["time_reps"])
    written.finish(result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _time(runner: _Runner, case: dict, mapping, reps: int) -> float | None:
    """Seconds per run of the program on a case, compiled kernels warm."""
    import torch

    program = runner.job["programs"][case["program"]]
    inputs = [
        x.to(runner.device) if isinstance(x, torch.Tensor) else x
        for x in mapping.inputs(case["layout"])
    ]
    scratch: dict = {"analysed": {}, "chosen": {}}
    try:
        with torch.no_grad():
            tensors = runner.materialize(program, inputs)
            runner.execute(program, tensors, False, scratch, case["program"])
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                runner.execute(program, tensors, False, scratch, case["program"])
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - no time, no speedup
        return None
    return (time.perf_counter() - start) / reps


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], started=lambda: print("started", flush=True))
