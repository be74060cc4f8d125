"""The kernel validator's data channel: one file in the job directory carrying every case's inputs
to the candidate's process and its outputs (and its inputs as they came back) to the parent,
whatever their size.

The parent (validator.py) plans a region per tensor, creates the file at its full size (it has no
file-size limit) and writes the inputs in. The worker (worker.py) maps each region of the file
shared: on CPU the candidate's inputs *are* their regions (an input the candidate modifies is seen
modified in the file, with no copy), and each output is copied into the region the parent laid out
for it, after its shape and dtype were checked against that layout. Writes through a mapping never
extend a file, so the worker's RLIMIT_FSIZE does not apply, and no torch.save of outputs is
needed. Each region is mapped on its own (page-aligned), so a tensor's storage is its region only,
not the whole file.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Any

FILE = "channel.bin"  # the replay's cases
EXTRACT = "extract.bin"  # the extraction's inputs, one set per input signature
ALIGN = mmap.ALLOCATIONGRANULARITY  # a region's offset must be page-aligned to be mapped alone


def spec(tensor, offset: int) -> dict[str, Any]:
    """The layout of one tensor's region: where it starts, its shape and dtype."""
    return {
        "offset": offset,
        "shape": list(tensor.shape),
        "dtype": str(tensor.dtype).removeprefix("torch."),
        "nbytes": tensor.numel() * tensor.element_size(),
    }


def plan(cases: list[tuple[list, list]]) -> tuple[list[dict], int]:
    """Regions for each case's (inputs, expected outputs): per case {"inputs": [spec, or
    {"value": v} for a non-tensor input], "outputs": [spec]}; and the file's size."""
    import torch

    offset, layout = 0, []

    def place(t) -> dict:
        nonlocal offset
        s = spec(t, offset)
        offset += -(-s["nbytes"] // ALIGN) * ALIGN
        return s

    for inputs, outputs in cases:
        layout.append(
            {
                "inputs": [
                    place(x) if isinstance(x, torch.Tensor) else {"value": x} for x in inputs
                ],
                "outputs": [place(w) for w in outputs],
            }
        )
    return layout, offset


def create(path: Path, size: int) -> None:
    """The channel file at its full size, its blocks allocated now: a full disk fails here, in the
    parent, not as a SIGBUS in the candidate's process."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it
                    raise
                os.ftruncate(fd, size)
    finally:
        os.close(fd)


class Mapping:
    """The channel file, open; ``tensor(spec)`` maps one region. ``writable``: shared, writes reach
    the file; otherwise copy-on-write (the parent reads, and never writes back)."""

    def __init__(self, path: Path, writable: bool):
        self.fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        self.access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_COPY
        self.maps: list[mmap.mmap] = []  # alive as long as their tensors

    def tensor(self, s: dict):
        import torch

        dtype = getattr(torch, s["dtype"])
        if not s["nbytes"]:
            return torch.empty(s["shape"], dtype=dtype)
        m = mmap.mmap(self.fd, s["nbytes"], access=self.access, offset=s["offset"])
        self.maps.append(m)
        return torch.frombuffer(m, dtype=dtype).view(s["shape"])

    def inputs(self, layout: dict) -> list:
        return [self.tensor(s) if "offset" in s else s["value"] for s in layout["inputs"]]

    def close(self) -> None:
        os.close(self.fd)


def flatten(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten(v)]
    return [value]


def put(mapping: Mapping, layout: dict, out) -> str | None:
    """Copy a forward's outputs into their regions; why not, if they do not fit the layout."""
    import torch

    have, want = flatten(out), layout["outputs"]
    if len(have) != len(want):
        return f"returned {len(have)} output(s), expected {len(want)}"
    for i, (h, s) in enumerate(zip(have, want, strict=True)):
        if not isinstance(h, torch.Tensor):
            return f"output {i} is {type(h).__name__}, expected a tensor"
        dtype = str(h.dtype).removeprefix("torch.")
        if list(h.shape) != s["shape"] or dtype != s["dtype"]:
            return (
                f"output {i} is {dtype} {tuple(h.shape)}, expected {s['dtype']} {tuple(s['shape'])}"
            )
    for h, s in zip(have, want, strict=True):
        mapping.tensor(s).copy_(h)
    return None
