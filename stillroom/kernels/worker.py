"""Runs one candidate in its own process: ``main(scratch, device)``, in a fresh interpreter
(``python -m stillroom.kernels.worker <scratch dir> <device>``) or in a child forked by the warm
fork server (forkserver.py), which has imported torch and triton already. Both paths run ``main``
unchanged.

The parent (validator.py) writes ``candidate.py``, ``job.pt`` (init inputs, the reference's
state dict, the layout of every trial's and case's inputs and outputs) and the channel file with
their inputs (channel.py) into a scratch directory and never lets this process see the
reference. Here the candidate is imported from its file (Triton needs real source), built,
loaded with the reference's weights and run on every trial. Recorded as it runs: each Triton kernel
launch (the launch path is wrapped) and each torch operation made outside a launch (a
TorchFunctionMode), so a forward that lets torch do the work, or defines a kernel it never
launches, is caught at run time as well as in the AST. Each output is copied into its region of
the channel once its shape and dtype match the layout (on CPU the inputs are their regions, so
they come back as the candidate left them); the records go to ``result.pt``; the parent compares.
The file ``started``, made just before candidate code runs, tells the parent that a later failure
is the candidate's.

Before any candidate code runs, the sandbox's audit hook (sandbox.py; Python code cannot remove it)
refuses sockets, subprocesses, forks, signals to other processes and file writes (C-level writes
hit an RLIMIT_FSIZE of 0 on CPU); freshly allocated outputs are filled with NaN so an element a
kernel never writes cannot pass by luck. The result is written last, then the process ends without
running any finalizer.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .. import sandbox
from . import channel

# Torch operations the forward path may make outside kernels: allocation, shapes, views, metadata.
ALLOCATIONS = {"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.Tensor.new_empty"}
ALLOWED_OPS = ALLOCATIONS | {
    "torch.zeros",
    "torch.zeros_like",
    "torch.Tensor.new_zeros",
    "torch.Tensor.view",
    "torch.Tensor.reshape",
    "torch.Tensor.contiguous",
    "torch.Tensor.t",
    "torch.Tensor.transpose",
    "torch.Tensor.permute",
    "torch.Tensor.size",
    "torch.Tensor.stride",
    "torch.Tensor.numel",
    "torch.Tensor.dim",
    "torch.Tensor.unsqueeze",
    "torch.Tensor.squeeze",
    "torch.Tensor.expand",
    "torch.Tensor.flatten",
    "torch.Tensor.data_ptr",
    "torch.Tensor.is_contiguous",
    "torch.Tensor.element_size",
    "torch.Tensor.view_as",
    "torch.Tensor.reshape_as",
    "torch.Tensor.expand_as",
    "torch.Tensor.unbind",
    "torch.Tensor.chunk",
    "torch.Tensor.split",
    "torch.Tensor.__getitem__",
    "torch.Tensor.__len__",
    "torch.Tensor.__hash__",
    "torch.Tensor.__format__",
    "torch.Tensor.storage_offset",
    "torch.Tensor.get_device",
}


class _State:
    in_launch = 0
    launches = 0
    records: list[dict] = []  # distinct launches (_launch_record)
    outside: set[str] = set()
    scratch = ""  # the job's directory: the result is written there, after the candidate is done
    writes_allowed = False


def _launch_dir(scratch: str) -> str:
    """Where Triton's own code may write inside a launch (a GPU compile: its cache, and the
    temporary files of ptxas). The candidate's job and result files are not in it."""
    return os.path.join(scratch, "launch")


def _writable() -> str | None:
    """The one directory that may be written to now: none while candidate code runs."""
    if _State.writes_allowed:
        return _State.scratch
    return _launch_dir(_State.scratch) if _State.in_launch else None


# Let through inside a Triton launch, where Triton's own code runs: a GPU compile starts ptxas.
_LAUNCH_EVENTS = {"subprocess.Popen", "_posixsubprocess.fork_exec", "os.posix_spawn"}


def _allow(event: str, args: tuple) -> bool:
    return bool(_State.in_launch) and event in _LAUNCH_EVENTS


MAX_LAUNCH_RECORDS = 64  # distinct launches kept for the parent's rules; a loop repeats them


def _launch_record(kernel, args: tuple, kwargs: dict) -> dict:
    """What the parent's launch rules (rules.launch_rules) need of one launch: the kernel's name,
    its constexpr arguments, its plain int arguments (strides) and num_warps (Triton's default 4).
    Autotuned and heuristic kernels reach here with their config's values among ``kwargs``."""
    import inspect

    fn = getattr(kernel, "fn", kernel)
    params = inspect.signature(fn).parameters
    if hasattr(kernel, "params"):  # JITFunction knows its constexprs
        constexprs = {p.name for p in kernel.params if p.is_constexpr}
    else:  # the interpreter's function: by annotation, as the interpreter itself decides
        constexprs = {
            name
            for name, p in params.items()
            if p.annotation is not inspect.Parameter.empty
            and str(getattr(p.annotation, "__name__", p.annotation)).endswith("constexpr")
        }
    bound = inspect.signature(fn).bind_partial(
        *args[: len(params)], **{k: v for k, v in kwargs.items() if k in params}
    )
    bound.apply_defaults()  # a default block size is a block size too
    plain = (bool, int, float, str)
    values = {k: v for k, v in bound.arguments.items() if isinstance(v, plain)}
    return {
        "kernel": fn.__name__,
        "constexprs": {k: v for k, v in values.items() if k in constexprs},
        "ints": {
            k: v
            for k, v in values.items()
            if k not in constexprs and isinstance(v, int) and not isinstance(v, bool)
        },
        "num_warps": kwargs.get("num_warps") or 4,
    }


def _wrap_launches() -> frozenset:
    """Count launches, mark their extent and record each distinct one, for the compiled and the
    interpreted kernel alike. Returns the wrappers' code objects: the audit finds launches on the
    stack by them."""
    from triton.runtime import jit

    classes = [jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:  # an older triton without the interpreter
        pass
    codes = set()
    for cls in classes:
        run = cls.run

        def counted(self, *args, _run=run, **kwargs):
            _State.launches += 1
            record = _launch_record(self, args, kwargs)
            if record not in _State.records and len(_State.records) < MAX_LAUNCH_RECORDS:
                _State.records.append(record)
            _State.in_launch += 1
            try:
                return _run(self, *args, **kwargs)
            finally:
                _State.in_launch -= 1

        cls.run = counted
        codes.add(counted.__code__)
    # An autotuner times its configs (do_bench: torch.quantile, a cache's zero_) before it
    # launches: Triton's own torch work too, so its run is a launch's extent for the audit.
    from triton.runtime import autotuner

    for cls in (autotuner.Autotuner, autotuner.Heuristics):
        run = cls.run

        def tuned(self, *args, _run=run, **kwargs):
            return _run(self, *args, **kwargs)

        cls.run = tuned
        codes.add(tuned.__code__)
    return frozenset(codes)


def _audit_mode(candidate_file: str, launch_codes: frozenset):
    import torch
    import triton
    from torch.overrides import TorchFunctionMode, resolve_name

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    triton_dir = os.path.dirname(triton.__file__) + os.sep

    def triton_internal() -> bool:
        """Whether this torch call is Triton's own work inside a launch (the interpreter copying
        arguments to the host and back, the binder reading dtypes, the autotuner timing): the
        nearest caller outside torch is in triton's package, and no frame of the candidate lies
        between it and the launch. A call the candidate makes, from the forward or from a kernel
        body, never is; the frames are read, not _State, which candidate code could rewrite."""
        frame = sys._getframe(2)  # the caller of __torch_function__: torch's dispatch or the call
        while frame is not None and frame.f_code.co_filename.startswith(torch_dir):
            frame = frame.f_back
        if frame is None or not frame.f_code.co_filename.startswith(triton_dir):
            return False
        while frame is not None:
            if frame.f_code in launch_codes:
                return True
            if frame.f_code.co_filename == candidate_file:
                return False
            frame = frame.f_back
        return False

    class Audit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if triton_internal():
                return out
            name = resolve_name(func) or getattr(func, "__qualname__", repr(func))
            # attribute access: reads (shape, dtype, device) pass, writes count as outside
            if name.endswith(".__get__") or name.endswith(".__set__"):
                if name.endswith(".__set__"):
                    _State.outside.add(name)
                return out
            if name not in ALLOWED_OPS:
                _State.outside.add(name)
            elif name in ALLOCATIONS and isinstance(out, torch.Tensor) and out.is_floating_point():
                # an element no kernel writes cannot match by luck
                out.fill_(float("nan"))
            return out

    return Audit()


def _aliases(outputs, inputs) -> list[str]:
    """Each output that shares memory with an input (returned as is, or a view of it): an output
    must be written by a kernel, and inputs that already hold the answer must not earn it."""
    import torch

    def tensors(value) -> list:
        if isinstance(value, torch.Tensor):
            return [value]
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in tensors(v)]
        return []

    found = []
    for i, out in enumerate(tensors(outputs)):
        for j, x in enumerate(tensors(inputs)):
            if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() and (
                out.untyped_storage().nbytes() and x.untyped_storage().nbytes()
            ):
                found.append(f"output {i} shares memory with input {j}")
    return found


def _to(value, device):
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


MEMORY_LIMIT_BYTES = 8 << 30  # address space of a CPU worker: torch and triton take ~3 GiB of it
FILE_LIMIT_BYTES = 256 << 20  # result.pt holds metadata only; the data goes through the channel
STARTED = "started"  # created once the job is loaded, just before candidate code runs


def _memory_limit(work: Path) -> int:
    """The address space of a CPU worker: the fixed allowance, the job's mapped files, and as much
    again as the channel for the candidate's outputs and working memory, so that the machine, not
    the harness, bounds an honest kernel's size."""
    data = (work / channel.FILE).stat().st_size
    return MEMORY_LIMIT_BYTES + (work / "job.pt").stat().st_size + 2 * data


def main(scratch: str, device: str) -> None:
    """Run the candidate in ``scratch`` (the current directory) and end the process: never
    returns."""
    work = Path(scratch)
    # CUDA maps far more virtual memory than it uses: no address-space cap there.
    sandbox.limit(
        memory_bytes=_memory_limit(work) if device == "cpu" else None,
        file_bytes=FILE_LIMIT_BYTES,
    )
    import torch

    # imported before the audit hook so its own start-up is not audited
    import triton  # noqa: F401

    # Triton launches on the current device: make it the job's GPU
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    # the weights mapped, not read in; every case's data is in the channel
    job = torch.load(work / "job.pt", weights_only=True, mmap=True)
    data = channel.Mapping(work / channel.FILE, writable=True)
    result: dict = {
        "stage": "import",
        "error": None,
        "outputs": [],  # per case run: None (its outputs are in the channel) or why not
        "seconds": None,
        "aliased": [],
    }
    # Triton's cache and temporary files (a GPU compile) go to the launch directory.
    _State.scratch = scratch
    launch = Path(_launch_dir(scratch))
    (launch / "tmp").mkdir(parents=True, exist_ok=True)
    os.environ.update(TRITON_CACHE_DIR=str(launch / "triton-cache"), TMPDIR=str(launch / "tmp"))
    tempfile.tempdir = str(launch / "tmp")
    # Up to here a failure is the harness's; the parent tells by this file (candidate code cannot
    # delete it: the audit hook refuses).
    (work / STARTED).touch()
    launch_codes = _wrap_launches()
    sandbox.guard(box=_writable, allow=_allow)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if device == "cpu":
        # C code writes files too (torch.save), unseen by the audit hook: EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        spec = importlib.util.spec_from_file_location("candidate", work / "candidate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        result["stage"] = "init"
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
        result["stage"] = "forward"
        audit = _audit_mode(str(work / "candidate.py"), launch_codes)
        for layout in job["trials"]:
            # on CPU the inputs are their regions of the channel: a modification shows there
            sent = data.inputs(layout)
            inputs = _to(sent, device)
            with torch.no_grad(), audit:  # only the candidate's forward is audited
                out = model(*inputs)
            result["aliased"] += _aliases(out, inputs)
            result["outputs"].append(channel.put(data, layout, out))
            if device != "cpu":  # the inputs as they came back, from the GPU
                for s, x in zip(sent, inputs, strict=True):
                    if isinstance(s, torch.Tensor):
                        s.copy_(x)
        if device.startswith("cuda") and job.get("time_reps"):
            first = _to(data.inputs(job["trials"][0]), device)
            result["seconds"] = _time(model, first, job["time_reps"])
        result["stage"] = "done"
    # any failure of candidate code is a result, SystemExit too
    except BaseException as exc:  # noqa: BLE001
        result["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-2000:]
    result.update(
        launches=_State.launches, outside=sorted(_State.outside), launch_records=_State.records
    )
    _State.writes_allowed = True
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    torch.save(result, work / "result.pt")
    # No candidate code after the result: skip finalizers and atexit, which could rewrite it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _time(model, inputs, reps: int) -> float:
    import torch

    with torch.no_grad():
        model(*inputs)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            model(*inputs)
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
