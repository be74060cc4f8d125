"""The replay: a trusted runner for a candidate's checked program (program.py). It runs in a
process that never ran candidate code (a fresh child of the fork server, or a fresh interpreter),
in its own sandbox, and executes only what the parent wrote: the canonical source of the checked
kernels (kernel_source.py), in a namespace holding ``tl``, ``triton`` and a few builtins, and the
program's steps as data.

``main(job dir, device)``. The parent wrote ``replay.json`` (the programs, per case which program
and where its inputs and outputs lie in the channel, the seed of the instance order, the
tolerances), ``kernels.py`` and its instrumented twin ``kernels_analysis.py``, ``state.pt`` (the
reference's parameters and buffers) and ``channel.bin`` with every case's inputs: the trials and
generated cases, drawn from a seed the candidate never saw. For each case the program's storages
are built (inputs are their channel regions on CPU, so a kernel that writes an input is seen
doing it; a constant is uninitialised memory, as an empty allocation), its steps run in order and
what it returns is copied into the case's output regions; the parent compares. The result (per
case: None or the error; the analysis; on a GPU the program's time) goes into ``result.bin``.

On CPU (Triton's interpreter) each launch runs every program instance one at a time, in a random
order drawn from the job's seed (a permutation; an affine one beyond 2**20 instances), with the
instrumented source; every load, store and atomic is checked against the buffers of its launch
before it happens (an access outside them is the kernel's error, not a read or write of this
process's memory); the bytes stores and atomics write are followed (``Written``: every byte of
every output must come from a kernel store, directly or through host copies); each instance's
plain loads and stores are kept (``Races``: an address one instance stores and another loads or
stores, without atomics, is a data race, whatever order ran). An autotuned launch runs its
chosen config (the first on CPU, the fastest on a GPU) on the case's tensors and every other
config on copies of them as they were before; each must compute what the chosen one did.

The analysis (the launch rules' values, launch_checks.py) comes from those same instrumented runs
on CPU: every launch, config, case and instance. On a GPU the compiled kernels run, and the first,
the last and ``GPU_SAMPLE`` more program instances (drawn from the seed) of every launch and
config are interpreted on copies for it: a rule broken in k of n instances is missed with
probability at most (1 - k/n)**GPU_SAMPLE per launch and case (k/n = 1/8: 1.4%). What is measured:
every dimension of every block a call returns, the operations per instance (a loop over run-time
bounds as its costliest iteration, the combine function of a
``tl.reduce`` or ``tl.associative_scan`` once per call, as a compiled reduction holds its body
once), and per access site the access that wastes the most memory
sectors with lanes laid out as Triton lays them.

A reduction or scan with a combine function of the program's (``tl.reduce(x, 1, combine)``,
Inductor's ``triton_helpers.max2``) runs as a GPU runs it, in a tree: one call of the combine per
level, on whole blocks, where Triton's interpreter would call it once per element (in Python,
re-patching ``tl`` for each helper it calls: minutes for one softmax). The combine must be
associative for Triton, so every order gives its result up to rounding, as on a GPU.

Builtin ``min``/``max`` of Triton tensors are ``tl.minimum``/``tl.maximum``, as Triton's compiler
makes them; of anything else they are Python's.
"""

from __future__ import annotations

import gc
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
MAX_PATTERNS = 4096  # access patterns remembered (each up to a block of addresses)
# a case whose storages hold more is collected after it (a full gc is too slow for every case)
GC_BYTES = 64 << 20
GPU_SAMPLE = 32  # program instances per launch a GPU's analysis interprets beyond first and last
WARP, SECTOR = 32, 32  # lanes that access memory together; bytes a memory transaction moves
# what Triton's compiler does on a GPU (ptxas): the kernels it compiles are checked sources
GPU_EVENTS = {"subprocess.Popen", "_posixsubprocess.fork_exec", "os.posix_spawn"}


def read_result(path: Path) -> tuple[dict | None, str | None]:
    return channel.Report.read(path, RESULT_MAGIC, RESULT_BYTES)


class ReplayError(Exception):
    """A step of the program failed: the candidate's failure."""


class _Memory:
    """Triton's interpreter reaches memory through one native module: this proxy checks each
    access against the buffers of the launch that runs, tells the analysis about it, records the
    bytes kernel stores write (``Written``) and each instance's plain accesses (``Races``)."""

    def __init__(self, real):
        self.real = real
        self.starts = self.ends = None
        self.analysis: Analysis | None = None
        self.written: Written | None = None
        self.races: Races | None = None

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

    def check(self, what: str, ptrs, mask, itemsize: int):
        """The live addresses of an access, once checked to lie in the launch's buffers."""
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
            return live
        index = np.searchsorted(self.starts, live, side="right").astype(np.int64) - 1
        inside = index >= 0
        ok = inside.copy()
        ok[inside] = live[inside] + np.uint64(itemsize) <= self.ends[index[inside]]
        if not ok.all():
            raise ReplayError(
                f"{_site()}: {what} of {int((~ok).sum())} element(s) outside every buffer passed "
                "to the launch"
            )
        return live

    def load(self, ptrs, mask, other, dtype):
        import numpy as np

        live = self.check("tl.load", ptrs, mask, np.dtype(dtype).itemsize)
        if self.races is not None:
            self.races.access(live, store=False)
        return self.real.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        live = self.check("tl.store", ptrs, mask, value.itemsize)
        if self.races is not None:
            self.races.access(live, store=True)
        if self.written is not None:
            self.written.mark(live, value.itemsize)
        return self.real.store(ptrs, value, mask)

    def atomic_rmw(self, op, ptrs, value, mask, sem):
        live = self.check("an atomic", ptrs, mask, value.itemsize)
        if self.written is not None:
            self.written.mark(live, value.itemsize)
        return self.real.atomic_rmw(op, ptrs, value, mask, sem)

    def atomic_cas(self, ptrs, cmp, value, sem):
        live = self.check("an atomic", ptrs, None, value.itemsize)
        if self.written is not None:
            self.written.mark(live, value.itemsize)
        return self.real.atomic_cas(ptrs, cmp, value, sem)


class Written:
    """Which bytes of the storages an output may come from were written by a kernel store or
    atomic, or copied by a host step from bytes that were (one flag per byte)."""

    def __init__(self, storages: dict[int, object]):
        import numpy as np

        self.index = sorted(storages, key=lambda i: storages[i].data_ptr())  # by address
        self.spans = {i: (storages[i].data_ptr(), storages[i].nbytes()) for i in self.index}
        self.flags = {i: np.zeros(storages[i].nbytes(), dtype=bool) for i in self.index}
        self.starts = np.array([self.spans[i][0] for i in self.index], dtype=np.uint64)

    def mark(self, live, itemsize: int) -> None:
        import numpy as np

        if live.size == 0 or not self.index:
            return
        which = np.searchsorted(self.starts, live, side="right").astype(np.int64) - 1
        for k, i in enumerate(self.index):
            start, nbytes = self.spans[i]
            offsets = live[which == k].astype(np.int64) - start
            offsets = offsets[(offsets >= 0) & (offsets < nbytes)]
            for b in range(itemsize):
                self.flags[i][offsets + b] = True

    def elements(self, storage: int, t):
        """Per element of tensor ``t`` (a view of ``storage``, row-major): whether every byte of
        it was written by a kernel; None when the storage is not followed."""
        import numpy as np

        if storage not in self.flags:
            return None
        size = t.element_size()
        offsets = _offsets(t) * size
        flags = self.flags[storage]
        return np.logical_and.reduce([flags[offsets + b] for b in range(size)])

    def copy(self, dst_storage: int, dst, src_storage: int, src) -> None:
        """A host copy of ``src`` into ``dst``: each byte of dst is kernel-made if its source
        element was."""
        import numpy as np

        if dst_storage not in self.flags:
            return
        made = self.elements(src_storage, src)
        if made is None:
            made = np.zeros(dst.numel(), dtype=bool)
        self.set(dst_storage, dst, made)

    def set(self, storage: int, t, made) -> None:
        if storage not in self.flags:
            return
        size = t.element_size()
        offsets = _offsets(t) * size
        for b in range(size):
            self.flags[storage][offsets + b] = made


def _offsets(t):
    """The element offsets (in its dtype) of a view's elements in its storage, row-major."""
    import numpy as np

    offsets = np.array(t.storage_offset(), dtype=np.int64)
    for n, stride in zip(t.shape, t.stride(), strict=True):
        offsets = offsets[..., None] + np.arange(n, dtype=np.int64) * stride
    return offsets.reshape(-1)


class Races:
    """The plain (not atomic) loads and stores of each program instance of one launch: on a GPU
    instances run concurrently and in no order, so an address one instance stores and another
    loads or stores is a data race, whatever order the interpreter ran them in."""

    def __init__(self):
        self.instance = 0
        self.stores: list = []
        self.loads: list = []

    def access(self, live, store: bool) -> None:
        import numpy as np

        if live.size:
            pairs = np.stack([live.astype(np.int64), np.full(live.size, self.instance)], axis=1)
            (self.stores if store else self.loads).append(pairs)

    def conflict(self) -> tuple[int, int, int] | None:
        """(address, one instance, another) of a race, or None."""
        import numpy as np

        if not self.stores:
            return None
        stores = np.concatenate(self.stores)
        stores = stores[np.lexsort((stores[:, 1], stores[:, 0]))]
        fresh = np.ones(len(stores), bool)
        fresh[1:] = (stores[1:] != stores[:-1]).any(axis=1)
        stores = stores[fresh]  # each (address, instance) once, by address
        addresses, first = np.unique(stores[:, 0], return_index=True)
        owner = stores[first, 1]  # an instance that stores each address
        doubled = np.flatnonzero(np.diff(stores[:, 0]) == 0)
        if doubled.size:
            k = doubled[0]
            return int(stores[k, 0]), int(stores[k, 1]), int(stores[k + 1, 1])
        if not self.loads:
            return None
        loads = np.concatenate(self.loads)
        where = np.searchsorted(addresses, loads[:, 0])
        where = np.minimum(where, addresses.size - 1)
        clash = (addresses[where] == loads[:, 0]) & (owner[where] != loads[:, 1])
        if clash.any():
            k = int(np.flatnonzero(clash)[0])
            return int(loads[k, 0]), int(owner[where[k]]), int(loads[k, 1])
        return None


_KERNEL_FILES: set[str] = set()


_SITES: dict[tuple, str] = {}  # (file, line, kernel) -> what _site says of it


def _site() -> str:
    """The kernel source line running now: 'kernel name: source text'."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename not in _KERNEL_FILES:
        frame = frame.f_back
    if frame is None:
        return "a kernel"
    key = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    if key not in _SITES:
        import linecache

        text = _unwrapped(linecache.getline(key[0], key[1]).strip())
        _SITES[key] = f"kernel {key[2].split('_', 1)[-1]}: {text}"
    return _SITES[key]


def _unwrapped(text: str) -> str:
    """A line of the instrumented source as the canonical source has it: each
    ``__sr_block(...)`` around a call taken off."""
    marker = kernel_source.BLOCK + "("
    while marker in text:
        start = text.index(marker)
        depth, end = 1, start + len(marker)
        while end < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        text = text[:start] + text[start + len(marker) : end - 1] + text[end:]
    return text


class Analysis:
    """The launch rules' values of one launch, from every program instance that runs
    instrumented: block shapes, operations per instance, and per access site the access that
    wastes the most memory sectors."""

    def __init__(self):
        # (touched, fewest) per access pattern: a pure function of the addresses relative to the
        # first, the first's place in its sector, the mask and the item size (see ``access``)
        self.judged: dict[tuple, tuple[int, int]] = {}
        self.reset()

    def reset(self) -> None:
        self.recording = False
        self.count = 0
        self.max_count = 0
        self.loops: list[list] = []  # open loops counted by their costliest iteration
        self.sizes: set[int] = set()
        self.sites: dict[tuple, dict] = {}

    def instance(self) -> None:
        self.max_count = max(self.max_count, self.count)
        self.count = 0
        self.loops.clear()

    def finish(self) -> dict:
        self.instance()
        return {
            "instructions": self.max_count,
            "sizes": sorted(self.sizes),
            "accesses": list(self.sites.values())[:MAX_ACCESS_SITES],
        }

    # called by the instrumented source (kernel_source.instrument)
    def op_count(self, n: int) -> None:
        if self.recording:
            self.count += n

    def once(self, combine_fn):
        """A reduction's or scan's combine function, counted on its first call only when it is
        one of the program's (Triton's own combines are recognised by identity: left as they are).
        """
        code = getattr(getattr(combine_fn, "fn", None), "__code__", None)
        if code is None or code.co_filename not in _KERNEL_FILES:
            return combine_fn
        analysis = self

        class Once:  # what the interpreter calls: combine_fn.fn(...)
            calls = 0

            @staticmethod
            def fn(*args):
                Once.calls += 1
                if Once.calls == 1:
                    return combine_fn.fn(*args)
                recording, analysis.recording = analysis.recording, False
                try:
                    return combine_fn.fn(*args)
                finally:
                    analysis.recording = recording

        return Once

    def loop(self, ident: str, kind: str, *args, **kwargs):
        """A ``for`` over a range. Over run-time bounds it stays a loop when compiled: it counts
        as its costliest iteration (each iteration's count is taken back when the next starts);
        over compile-time bounds it is unrolled: every iteration counts."""
        import triton.language as tl

        bounds = [*args, kwargs.get("step")] if "step" in kwargs else list(args)
        runtime = kind != "static" and any(isinstance(b, tl.tensor) for b in bounds)
        values = [int(b.value if isinstance(b, tl.constexpr) else b) for b in args]
        step = kwargs.get("step")
        if step is not None:
            values.append(int(step.value if isinstance(step, tl.constexpr) else step))
        for v in range(*values):
            if runtime:
                self.iteration(ident)
            yield v

    def iteration(self, ident: str) -> None:
        """An iteration of a loop that stays a loop begins."""
        if self.loops and self.loops[-1][0] == ident:
            _, start, best = self.loops[-1]
            self.loops[-1][2] = max(best, self.count - start)
            self.count = start
        else:
            self.loops.append([ident, self.count, 0])

    def loop_end(self, ident: str) -> None:
        idents = [entry[0] for entry in self.loops]
        if ident not in idents:
            return  # unrolled, or no iteration ran
        while self.loops:
            name, start, best = self.loops.pop()
            self.count = start + max(best, self.count - start)
            if name == ident:
                return

    def block(self, value):
        """Every dimension of a block a call returned (a helper may return several)."""
        import triton.language as tl

        if self.recording:
            for v in value if isinstance(value, tuple) else (value,):
                if isinstance(v, tl.tensor):
                    for d in v.shape:
                        self.sizes.add(int(d.value if isinstance(d, tl.constexpr) else d))
        return value

    def access(self, what: str, addresses, mask, itemsize: int) -> None:
        """The memory sectors (32 bytes) a warp's active lanes touch, and the fewest their
        distinct addresses could take (``_sectors``), summed over the access's warps, with lanes
        laid out as Triton lays them: along the most contiguous axis (the last on a tie), 32 to a
        warp. A row's edge along an axis (``_continues``) neither breaks its contiguity nor is
        charged. Each access is judged alone; per site the worst one is kept. A scalar passes."""
        import numpy as np

        if not self.recording:
            return
        a = np.asarray(addresses).astype(np.int64)
        if a.size <= 1:
            return
        m = (
            np.ones(a.shape, bool)
            if mask is None
            else np.broadcast_to(np.asarray(mask, bool), a.shape)
        )
        # the program instances of a launch mostly repeat one pattern at other addresses
        first = int(a.flat[0])
        key = (a.shape, itemsize, first % SECTOR, (a - first).tobytes(), m.tobytes())
        if key not in self.judged:
            if len(self.judged) >= MAX_PATTERNS:
                self.judged.clear()
            self.judged[key] = _judged(a, m, itemsize)
        touched, fewest = self.judged[key]
        if not fewest:
            return
        site = _site()
        entry = self.sites.setdefault(
            (what, site), {"what": what, "site": site, "touched": 0, "fewest": 1}
        )
        if touched * entry["fewest"] > entry["touched"] * fewest:
            entry["touched"], entry["fewest"] = touched, fewest


def _judged(a, m, itemsize: int) -> tuple[int, int]:
    """(touched, fewest) sectors of one access: addresses ``a``, mask ``m`` (see ``access``)."""
    import numpy as np

    axis = max(range(a.ndim), key=lambda d: (_contiguity(_continues(a, d, itemsize)[0]), d))
    lanes = np.moveaxis(a, axis, -1).reshape(-1)
    active = np.moveaxis(m, axis, -1).reshape(-1)
    # a lane begins a row where its line along the lane axis begins or a row's edge cuts it
    edges = _continues(a, axis, itemsize)[1]
    starts = np.concatenate([np.ones((*edges.shape[:-1], 1), bool), edges], axis=-1)
    rows = np.cumsum(starts.reshape(-1))
    return _sectors(lanes, active, itemsize, rows)


def _continues(a, axis: int, itemsize: int):
    """(steps, edges), per pair of neighbours along ``axis`` (moved last): whether the pair
    continues a row of memory, and whether it is a row's edge. A pair continues a row when its
    addresses lie one element apart, or at a row's edge: a jump in a line along ``axis`` that
    jumps at most once per sector's worth of elements, as where ``xindex % ks`` wraps into the
    next row. Where the size is odd, Triton's axis analysis loses the contiguity and lays lanes
    along the other axis; on a size the block divides (as the problem's own sizes are) they
    run along this one and coalesce. The rule charges what an odd size causes no more than
    an odd stride: lanes run along this axis, each row from its edge costs what it needs."""
    import numpy as np

    unit = np.diff(np.moveaxis(a, axis, -1), axis=-1) == itemsize
    jumps = (~unit).sum(axis=-1, keepdims=True)
    edges = ~unit & (jumps * max(1, SECTOR // itemsize) <= a.shape[axis])
    return unit | edges, edges


def _contiguity(steps) -> int:
    """How many neighbours along the last axis of ``steps`` (the pairs that continue a row, along
    an axis of one more element) lie in one row in every aligned run (a power of two: Triton's
    contiguity of a pointer block)."""
    import numpy as np

    n = steps.shape[-1] + 1
    run = 1
    while run * 2 <= n:
        run *= 2
        # within each aligned run of `run` elements, every step but the run's last continues
        inner = np.arange(n - 1) % run != run - 1
        if not steps[..., inner].all():
            return run // 2
    return run


def _sectors(lanes, active, itemsize: int, rows) -> tuple[int, int]:
    """(sectors the warps touch, the fewest their addresses need), 32 lanes a warp; ``rows``: per
    lane, the row it belongs to (numbered in lane order). Per warp and row, the fewest sectors of
    its distinct active addresses packed from its first one: a row cut by the warp's edge, a mask
    or a row's edge, or starting off a sector's edge (odd strides), costs what any layout would."""
    import numpy as np

    pad = -lanes.size % WARP
    index = np.arange(lanes.size)
    lanes = np.concatenate([lanes, np.zeros(pad, np.int64)]).reshape(-1, WARP)
    active = np.concatenate([active, np.zeros(pad, bool)]).reshape(-1, WARP)
    low = np.where(active, lanes // SECTOR, -1)
    high = np.where(active, (lanes + itemsize - 1) // SECTOR, -1)
    touched = int(_distinct(np.concatenate([low, high], axis=1)).sum())
    live = active.reshape(-1)[: index.size]
    group = (index // WARP * (index.size + 1) + rows)[live]
    address = lanes.reshape(-1)[: index.size][live]
    order = np.lexsort((address, group))
    group, address = group[order], address[order]
    starts = np.ones(group.size, bool)
    starts[1:] = group[1:] != group[:-1]
    new = starts.copy()
    new[1:] |= address[1:] != address[:-1]
    first = np.flatnonzero(starts)
    distinct = np.add.reduceat(new.astype(np.int64), first) if first.size else first
    fewest = -(-(distinct * itemsize + address[first] % SECTOR) // SECTOR)
    return touched, int(fewest.sum())


def _distinct(rows):
    """Per row, how many distinct values other than -1 it holds."""
    import numpy as np

    rows = np.sort(rows, axis=1)
    new = np.ones(rows.shape, bool)
    new[:, 1:] = rows[:, 1:] != rows[:, :-1]
    return (new & (rows != -1)).sum(axis=1)


class _Runner:
    def __init__(self, work: Path, device: str):
        import numpy as np
        import torch
        import triton
        import triton.language as tl

        self.work, self.device = work, device
        self.torch, self.triton, self.tl = torch, triton, tl
        self.job = json.loads((work / "replay.json").read_text())
        self.state = torch.load(work / "state.pt", weights_only=True)
        self.dtypes = kernel_source.language().dtypes
        self.memory: _Memory | None = None
        self.analysis = Analysis()
        _tree_reductions()
        self.written: Written | None = None  # the case's, on CPU
        self.analysing = True  # off while a GPU times the program
        # the order of program instances and the GPU's sample: a seed the candidate never saw
        self.rng = np.random.default_rng(self.job["order_seed"])
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
                    kernel_source.BLOCK: a.block,
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
    def materialize(self, program: dict, inputs: list) -> tuple[list, list]:
        """(storages, tensors) of a case. A constant (a tensor the candidate's process made
        outside the program) is uninitialised memory, as an empty allocation: only inputs,
        parameters and buffers carry values into a program."""
        torch = self.torch
        storages = []
        for s in program["storages"]:
            kind, nbytes = s["kind"], s["nbytes"]
            if kind == "input":
                storage = inputs[s["index"]].untyped_storage()
            elif kind == "state":
                storage = self.state[s["name"]].to(self.device, copy=True).untyped_storage()
            else:
                raw = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
                if s.get("fill") is None:
                    raw.fill_(0xFF)  # NaN in every float format: no element passes unwritten
                else:
                    dtype = getattr(torch, s["dtype"])
                    size = torch.empty(0, dtype=dtype).element_size()
                    raw.zero_()
                    raw[: nbytes // size * size].view(dtype).fill_(s["fill"])
                storage = raw.untyped_storage()
            if storage.nbytes() < nbytes:
                raise ReplayError(f"a {kind} storage holds {storage.nbytes()} bytes, not {nbytes}")
            storages.append(storage)
        return storages, [self.view(storages[t["storage"]], t) for t in program["tensors"]]

    def view(self, storage, t: dict):
        view = self.torch.empty(0, dtype=getattr(self.torch, t["dtype"]), device=storage.device)
        return view.set_(storage, t["offset"], t["shape"], t["stride"])

    def arguments(self, launch: dict, tensors: list) -> dict:
        out = {}
        for name, arg in launch["args"].items():
            if "tensor" in arg:
                out[name] = tensors[arg["tensor"]]
            elif "dtype" in arg:
                out[name] = getattr(self.tl, self.dtypes[arg["dtype"]])
            else:
                out[name] = arg["value"]
        return out

    def launch(self, launch: dict, kwargs: dict, result: dict, key: str, real: bool) -> None:
        """Run one launch on ``kwargs``. On CPU every program instance runs interpreted and
        instrumented, in a random order; on a GPU the compiled kernel runs, then a sample of its
        instances is interpreted on copies for the analysis. ``real``: kwargs are the case's own
        tensors (the written bytes are followed), not a config's copies."""
        torch = self.torch
        grid = list(launch["grid"]) + [1] * (3 - len(launch["grid"]))
        if self.device == "cpu":
            written = self.written if real else None
            measured = self.interpret(launch, kwargs, grid, self.order(grid), written)
        else:
            # the analysis's copies, of the memory as the launch finds it
            copies: dict[int, object] = {}
            on_cpu = dict(kwargs)
            for name, value in kwargs.items():
                if isinstance(value, torch.Tensor) and self.analysing:
                    storage = value.untyped_storage()
                    copy = copies.setdefault(storage.data_ptr(), storage.cpu())
                    on_cpu[name] = torch.empty(0, dtype=value.dtype).set_(
                        copy, value.storage_offset(), value.shape, value.stride()
                    )
            kernel = self.kernels[launch["kernel"]]
            try:
                kernel[tuple(launch["grid"])](**_options(launch, kwargs))
            except Exception as exc:  # noqa: BLE001 - the kernel's failure (compile, launch)
                raise ReplayError(f"launch of {launch['name']}: {_message(exc)}") from None
            if not self.analysing:
                return
            measured = self.interpret(launch, on_cpu, grid, self.sample(grid), None)
        _merge(result["analysed"], key, measured)

    def order(self, grid: list[int]):
        """Every program instance of ``grid``, in a random order: a permutation up to 2**20
        instances, beyond that an affine one (i -> a*i + b mod n, a coprime to n, not 1)."""
        import math

        n = math.prod(grid)
        if n <= 1 << 20:
            linear = iter(self.rng.permutation(n).tolist())
        else:
            a = int(self.rng.integers(2, n))
            while math.gcd(a, n) != 1:
                a = int(self.rng.integers(2, n))
            b = int(self.rng.integers(0, n))
            linear = ((a * i + b) % n for i in range(n))
        for i in linear:
            yield i % grid[0], i // grid[0] % grid[1], i // (grid[0] * grid[1])

    def sample(self, grid: list[int]) -> list[tuple]:
        """The instances a GPU's analysis interprets: the first, the last and GPU_SAMPLE more
        drawn at random."""
        import math

        n = math.prod(grid)
        picked = {0, n - 1} | {int(i) for i in self.rng.integers(0, n, size=GPU_SAMPLE)}
        return [(i % grid[0], i // grid[0] % grid[1], i // (grid[0] * grid[1])) for i in picked]

    def interpret(self, launch: dict, kwargs: dict, grid, instances, written) -> dict:
        """Run ``instances`` of a launch with the instrumented source, one at a time; the launch
        rules' values of the run. Raises ReplayError on a data race between two instances."""
        from triton.runtime import interpreter

        torch = self.torch
        ifn = self.analysed[launch["kernel"]]
        fn = ifn.rewrite()
        constexprs = interpreter.GridExecutor(fn, ifn.arg_names, tuple(grid)).constexprs
        argspec = inspect.getfullargspec(fn)
        kwargs = {k: v for k, v in kwargs.items() if k in argspec.args}
        builder = interpreter.interpreter_builder
        analysis, races = self.analysis, Races()
        analysis.reset()
        memory = self._memory()
        memory.allow([v for v in kwargs.values() if isinstance(v, torch.Tensor)])
        memory.analysis, memory.written, memory.races = analysis, written, races

        class Reduce(interpreter.ReduceOps):
            def __init__(self, axis, combine_fn, keep_dims):
                super().__init__(axis, analysis.once(combine_fn), keep_dims)

        class Scan(interpreter.ScanOps):
            def __init__(self, axis, combine_fn, reverse):
                super().__init__(axis, analysis.once(combine_fn), reverse)

        reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
        # what tl.reduce and tl.associative_scan make, as the interpreter patches them in for
        # the kernel and again for each helper it calls
        interpreter.ReduceOps, interpreter.ScanOps = Reduce, Scan
        scope = interpreter._patch_lang(fn)
        try:
            args = inspect.getcallargs(fn, **kwargs)
            args = {
                n: a
                if n in constexprs
                else interpreted_float(self.tl, a)
                if type(a) is float
                else interpreter._implicit_cvt(a)
                for n, a in args.items()
            }
            builder.set_grid_dim(*grid)
            for x, y, z in instances:
                builder.set_grid_idx(x, y, z)
                analysis.instance()
                races.instance = x + grid[0] * (y + grid[1] * z)
                analysis.recording = True
                try:
                    fn(**args)
                finally:
                    analysis.recording = False
        except Exception as exc:  # noqa: BLE001 - the kernel's failure, as a compile would give
            cause = exc
            while cause is not None and not isinstance(cause, ReplayError):
                cause = cause.__cause__
            raise cause or ReplayError(f"launch of {launch['name']}: {_message(exc)}") from None
        finally:
            scope.restore()
            interpreter.ReduceOps, interpreter.ScanOps = reduce_ops, scan_ops
            memory.analysis = memory.written = memory.races = None
        clash = races.conflict()
        if clash is not None:
            _, one, other = clash
            raise ReplayError(
                f"launch of {launch['name']}: program instances {one} and {other} access one "
                "address without atomics, one of them storing (a data race: on a GPU instances run "
                "concurrently, in no order)"
            )
        return analysis.finish()

    def _memory(self) -> _Memory:
        """The bounds-checking proxy around the interpreter's memory access, installed once."""
        if self.memory is None:
            from triton.runtime import interpreter

            self.memory = _Memory(interpreter._interpreter)
            interpreter._interpreter = self.memory
        return self.memory

    def run(self, program: dict, inputs: list, result: dict, index: int):
        """Run one case's program; its returned value (tensors and nesting). On CPU every byte of
        every output must come from a kernel store (directly, or through host copies)."""
        storages, tensors = self.materialize(program, inputs)
        cpu = self.device == "cpu"
        followed = _followed(program)
        self.written = Written({i: storages[i] for i in followed}) if cpu else None
        self.execute(program, tensors, result, index)
        for k, t in enumerate(_flat(program["returns"])):
            storage = program["tensors"][t]["storage"]
            made = self.written.elements(storage, tensors[t]) if cpu else None
            if made is not None and not made.all():
                raise ReplayError(
                    f"output {k}: {int((~made).sum())} of {made.size} elements are not written "
                    "by a kernel store (host steps alone made them: an allocation, a fill, a copy "
                    "of an input)"
                )
        return _returned(program["returns"], tensors)

    def host(self, step: dict, program: dict, tensors: list, written) -> None:
        """A fill or a copy; ``written`` (the case's, or None) follows the bytes it sets."""
        if step["op"] == "fill":
            t = tensors[step["tensor"]]
            t.fill_(step["value"])
            if written is not None:
                written.set(program["tensors"][step["tensor"]]["storage"], t, False)
        else:
            dst, src = tensors[step["dst"]], tensors[step["src"]]
            dst.copy_(src.reshape(dst.shape))
            if written is not None:
                written.copy(
                    program["tensors"][step["dst"]]["storage"], dst,
                    program["tensors"][step["src"]]["storage"], src,
                )  # fmt: skip

    def execute(self, program: dict, tensors: list, result: dict, index: int):
        for i, step in enumerate(program["steps"]):
            if step["op"] != "launch":
                self.host(step, program, tensors, self.written)
            else:
                self.configs(program, step["alternatives"], tensors, result, f"{index}:{i}")

    def configs(self, program: dict, alternatives: list, tensors: list, result: dict, key: str):
        """An autotuned launch: the chosen config runs on the case's tensors, every other one on
        copies of them as they were before; each must compute what the chosen one did (an
        autotuner may pick any), and each is analysed. A config's ``before`` steps (its
        autotuner's hooks) run before it, on the tensors it runs on."""
        choice = self.choose(alternatives, tensors) if len(alternatives) > 1 else 0
        result["chosen"][key] = choice
        several = len(alternatives) > 1 and self.analysing
        saved = self.snapshot(alternatives, tensors) if several else {}
        chosen = alternatives[choice]
        for step in chosen.get("before", []):
            self.host(step, program, tensors, self.written)
        self.launch(chosen, self.arguments(chosen, tensors), result, f"{key}:{choice}", True)
        for j, alt in enumerate(alternatives):
            if j == choice or not self.analysing:
                continue
            copies = {ptr: storage.clone() for ptr, storage in saved.items()}
            theirs = [
                self.view(copies[ptr], spec)
                if (ptr := t.untyped_storage().data_ptr()) in copies
                else t
                for t, spec in zip(tensors, program["tensors"], strict=True)
            ]
            for step in alt.get("before", []):
                self.host(step, program, theirs, None)
            real, kwargs = self.arguments(alt, tensors), self.arguments(alt, theirs)
            self.launch(alt, kwargs, result, f"{key}:{j}", False)
            for name, v in real.items():
                if isinstance(v, self.torch.Tensor):
                    why = self.differs(kwargs[name], v)
                    if why:
                        raise ReplayError(
                            f"config {j} of the autotuned launch of {alt['name']} computes other "
                            f"values than config {choice} in {name} ({why}): an autotuner may "
                            "pick either"
                        )

    def snapshot(self, alternatives: list, tensors: list) -> dict:
        """Copies of every storage the alternatives' tensor arguments and hooks' steps live in,
        by address."""
        out = {}
        for alt in alternatives:
            used = [v for v in self.arguments(alt, tensors).values()]
            used += [tensors[s.get("tensor", s.get("dst"))] for s in alt.get("before", [])]
            for v in used:
                if isinstance(v, self.torch.Tensor):
                    storage = v.untyped_storage()
                    if storage.data_ptr() not in out:
                        out[storage.data_ptr()] = storage.clone()
        return out

    def differs(self, got, want) -> str | None:
        """How ``got`` differs from ``want`` beyond the dtype's tolerance, or None."""
        torch = self.torch
        if got.is_floating_point():
            rtol, atol = self.job["tolerances"][str(want.dtype).removeprefix("torch.")]
            finite = want[want.isfinite()]
            scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
            close = torch.isclose(got, want, rtol=rtol, atol=atol * scale, equal_nan=True)
        else:
            close = got == want
        bad = int((~close).sum())
        return f"{bad} of {want.numel()} elements differ" if bad else None

    def choose(self, alternatives: list, tensors: list) -> int:
        """Which config of an autotuned launch runs on the case's tensors: the first on CPU; on a
        GPU the fastest, timed here on copies of its arguments."""
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
                kernel(**_options(alt, scratch))
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(5):
                    kernel(**_options(alt, scratch))
                torch.cuda.synchronize()
                seconds = (time.perf_counter() - start) / 5
            except Exception:  # noqa: BLE001 - a config that fails is not chosen
                continue
            if seconds < best_s:
                best, best_s = j, seconds
        return best


def _merge(analysed: dict, key: str, measured: dict) -> None:
    """Fold one run's values into the launch's: the most instructions, every block size, per
    access site the worst access."""
    program, step, alternative = (int(k) for k in key.split(":"))
    entry = analysed.setdefault(
        key,
        {"program": program, "step": step, "alternative": alternative, "instructions": 0,
         "sizes": [], "accesses": []},
    )  # fmt: skip
    entry["instructions"] = max(entry["instructions"], measured["instructions"])
    entry["sizes"] = sorted(set(entry["sizes"]) | set(measured["sizes"]))
    sites = {(a["what"], a["site"]): a for a in entry["accesses"]}
    for a in measured["accesses"]:
        old = sites.get((a["what"], a["site"]))
        if old is None or a["touched"] * old["fewest"] > old["touched"] * a["fewest"]:
            sites[(a["what"], a["site"])] = a
    entry["accesses"] = list(sites.values())[:MAX_ACCESS_SITES]


def _followed(program: dict) -> set[int]:
    """The storages an output's bytes may come from: the returned ones and, through host
    copies, their sources (never an input's: an input is not a kernel's to write)."""
    storage_of = [t["storage"] for t in program["tensors"]]
    followed = {storage_of[t] for t in _flat(program["returns"])}
    copies = [(storage_of[s["dst"]], storage_of[s["src"]]) for s in program["steps"]
              if s["op"] == "copy"]  # fmt: skip
    grown = True
    while grown:
        grown = False
        for dst, src in copies:
            if dst in followed and src not in followed:
                followed.add(src)
                grown = True
    return {i for i in followed if program["storages"][i]["kind"] != "input"}


def _flat(spec):
    """The tensor indices a program returns, flattened."""
    if "tensor" in spec:
        yield spec["tensor"]
    for kind in ("tuple", "list"):
        for s in spec.get(kind, []):
            yield from _flat(s)


# Builtins that would read a run-time value into Python (Triton's compiler refuses that; its
# interpreter would let a kernel compute in Python): on a Triton tensor they raise.
SCALAR_ONLY = ("int", "float", "bool")
# Builtins Triton's compiler maps onto triton.language for tensors (core.builtin_min/max)
ELEMENTWISE = {"min": "minimum", "max": "maximum"}


def _options(launch: dict, kwargs: dict) -> dict:
    """A launch's keywords: its arguments and its options, an argument winning where a kernel
    has a parameter named like an option (Triton binds the keyword to the parameter)."""
    return {"num_warps": launch["num_warps"], "num_stages": launch["num_stages"], **kwargs}


def interpreted_float(tl, value: float):
    """A float argument as Triton's compiler types it, an fp32 scalar: Triton's interpreter passes
    it on as a Python float (only ints become tensors), on which ``eps.to(tl.float32)`` fails and
    arithmetic runs in float64."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    return tl.tensor(TensorHandle(np.array([value], dtype=np.float32), tl.float32), tl.float32)


def _builtins(tl) -> dict:
    import builtins
    import functools

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

    def elementwise(name: str):
        real = getattr(builtins, name)

        def call(*args, **kwargs):
            if any(isinstance(a, tl.tensor) for a in args):
                if len(args) < 2 or kwargs:  # Python's would iterate a tensor
                    raise TypeError(f"{name}() of Triton tensors takes two or more of them")
                # looked up now: the interpreter patches tl's members while a kernel runs
                return functools.reduce(getattr(tl, ELEMENTWISE[name]), args)
            return real(*args, **kwargs)

        return call

    def make(n: str):
        if n in SCALAR_ONLY:
            return strict(n)
        return elementwise(n) if n in ELEMENTWISE else getattr(builtins, n)

    return {n: make(n) for n in kernel_source.BUILTINS}


def _tree_reductions() -> None:
    """Triton's interpreter, in this process, reducing and scanning with a program's combine
    function in a tree (the module docstring); its own combines (sum, max ...) as before."""
    import numpy as np
    from triton.runtime import interpreter

    def combine(op, input: tuple, left: list, right: list) -> list:
        """The program's combine of the arrays ``left`` and ``right`` (one per input), element by
        element, as arrays of ``left``'s shapes and dtypes."""
        sides = [
            [op.to_tensor(a, arg.dtype) for a, arg in zip(side, input, strict=True)]
            for side in (left, right)
        ]
        out = op.combine_fn.fn(*sides[0], *sides[1])
        out = out if isinstance(out, tuple) else (out,)
        return [
            np.broadcast_to(o.handle.data if hasattr(o, "handle") else o, a.shape).astype(a.dtype)
            for o, a in zip(out, left, strict=True)
        ]

    class TreeReduce(interpreter.ReduceOps):
        def generic_reduce(self, input):
            original_axis = self.axis
            input, axis = self.unravel(input, self.axis)
            shape = input[0].handle.data.shape
            data = [np.moveaxis(arg.handle.data, axis, 0) for arg in input]
            while data[0].shape[0] > 1:  # neighbours in pairs: the order of the elements kept
                even = data[0].shape[0] // 2 * 2
                pairs = combine(
                    self, input, [d[0:even:2] for d in data], [d[1:even:2] for d in data]
                )
                data = [np.concatenate([c, d[even:]]) for c, d in zip(pairs, data, strict=True)]
            out = []
            for d, arg in zip(data, input, strict=True):
                value = d[0]
                if self.keep_dims:
                    value = (
                        np.expand_dims(value, axis)
                        if original_axis is not None
                        else value.reshape((1,) * len(shape))
                    )
                elif original_axis is None:
                    value = value.item()
                out.append(self.to_tensor(value, arg.dtype))
            return out

    class TreeScan(interpreter.ScanOps):
        def generic_scan(self, input):
            data = [np.moveaxis(arg.handle.data, self.axis, 0) for arg in input]
            n, step = data[0].shape[0], 1
            while step < n:  # Hillis and Steele: each element combined with the one step before
                # whole blocks (Triton's shapes are powers of two): the first step elements are
                # combined with themselves, and kept as they were
                earlier = [np.concatenate([d[:step], d[: n - step]]) for d in data]
                later = combine(self, input, earlier, data)
                data = [
                    np.concatenate([d[:step], c[step:]]) for c, d in zip(later, data, strict=True)
                ]
                step *= 2
            return [
                self.to_tensor(np.ascontiguousarray(np.moveaxis(d, 0, self.axis)), arg.dtype)
                for d, arg in zip(data, input, strict=True)
            ]

    interpreter.ReduceOps, interpreter.ScanOps = TreeReduce, TreeScan


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
    first_inputs = None
    for case in runner.job["cases"]:
        index = case["program"]
        program = runner.job["programs"][index]
        sent = mapping.inputs(case["layout"])
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in sent]
        try:
            with torch.no_grad():
                out = runner.run(program, inputs, result, index)
                if device != "cpu":
                    torch.cuda.synchronize()
            why = channel.put(mapping, case["layout"], out)
            # this case's storages go before the next case makes its own: Triton's interpreter
            # keeps a launch's arguments in a reference cycle (a recursive closure over them), so
            # only a collection frees them; run where the storages are large enough to matter
            del out
            if sum(s["nbytes"] for s in program["storages"] if s["kind"] != "input") > GC_BYTES:
                gc.collect()
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
    runner.analysing = False
    try:
        with torch.no_grad():
            _, tensors = runner.materialize(program, inputs)
            runner.execute(program, tensors, scratch, case["program"])
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                runner.execute(program, tensors, scratch, case["program"])
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - no time, no speedup
        return None
    return (time.perf_counter() - start) / reps


if __name__ == "__main__":
    from .isolation import limit_cpu

    limit_cpu(float(sys.argv[3]))
    main(sys.argv[1], sys.argv[2], started=lambda: print("started", flush=True))
