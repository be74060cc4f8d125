"""The kernel validator's data channels and reports: files in a job directory that the parent
creates at their full size and the job maps, whatever the size of the data.

A channel carries tensors: the extraction's inputs (``EXTRACT``, mapped copy-on-write: nothing the
candidate does reaches the file), or every case's inputs to the replay and its outputs (and its
inputs as they came back) to the parent (``FILE``). The parent (validator.py) plans a region per
tensor, creates the file (it has no file-size limit) and writes the inputs in. On CPU the replay's
inputs *are* their regions (an input a kernel modifies is seen modified in the file, with no copy),
and each output is copied into the region laid out for it, after its shape and dtype were checked
against that layout. Writes through a mapping never extend a file, so a job's RLIMIT_FSIZE does
not apply. Each region is mapped on its own (page-aligned), so a tensor's storage is its region
only, not the whole file. A ``Report`` is a job's JSON answer (and the extraction's constants).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
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


class Report:
    """A job's report to the parent: a file the parent made at its full size (sparse), mapped by
    the job before its own code runs (writes through a mapping never extend a file), holding a
    header (magic, the JSON's length) and the JSON. The parent reads it once the job ended."""

    HEADER = struct.Struct("<8sQ")

    def __init__(self, path: Path, magic: bytes, space: int):
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_WRITE)
        finally:
            os.close(fd)
        self.magic, self.space = magic, space

    def finish(self, obj: dict) -> None:
        data = json.dumps(obj, default=repr).encode()
        if len(data) > self.space - self.HEADER.size:
            data = json.dumps({"error": f"the report takes {len(data)} bytes"}).encode()
        self.map[self.HEADER.size : self.HEADER.size + len(data)] = data
        self.map[: self.HEADER.size] = self.HEADER.pack(self.magic, len(data))

    @classmethod
    def read(cls, path: Path, magic: bytes, space: int) -> tuple[dict | None, str | None]:
        """(the JSON, why there is none)."""
        with open(path, "rb") as f:
            head = f.read(cls.HEADER.size)
            if len(head) < cls.HEADER.size or cls.HEADER.unpack(head)[0] != magic:
                return None, "nothing was written"
            _, length = cls.HEADER.unpack(head)
            if length > space - cls.HEADER.size:
                return None, "its header is out of range"
            try:
                return json.loads(f.read(length)), None
            # written by the job: nested past the parser's depth, or not JSON at all
            except (ValueError, RecursionError) as exc:
                return None, f"it is not JSON ({type(exc).__name__}: {str(exc)[:200]})"


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
