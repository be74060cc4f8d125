"""How large an honest kernel the validator scores: ReLU at (rows, 393216) and KernelBench level 1
problem 12, diag(A) @ B at N = M, with honest Triton kernels, on CPU (Triton's interpreter).

Each size runs in a fresh process (``evaluate`` with ``isolation="process"``, so that the
extraction and the replay are that process's children) and reports the reward, its status, the
wall time, the peak resident memory of the validator and of its largest job, and the bytes of
both channels (the extraction's inputs; every case's inputs and outputs).

    python bench/kernel_validator_sizes.py [--relu-rows 64 128 256] [--diag 4096] [--trials 3]
        [--cases mixed_sign negative ...]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import textwrap
import time

RELU = textwrap.dedent('''
    """ReLU at KernelBench's size (level 1 problem 19), drawn as KernelBench does."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, x):
            return torch.relu(x)


    def get_inputs():
        return [torch.rand(ROWS, 393216)]


    def get_init_inputs():
        return []
    ''')
RELU_KERNEL = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, per_program, BLOCK: tl.constexpr):
        # each program walks its span block by block: few programs for Triton's interpreter, and a
        # block within the rule reward's limit
        start = tl.program_id(0) * per_program
        for i in range(0, per_program, BLOCK):
            offs = start + i + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x):
            x = x.contiguous()
            out = torch.empty_like(x)
            span = 1 << 20
            relu_kernel[(triton.cdiv(x.numel(), span),)](x, out, x.numel(), span, BLOCK=2048)
            return out
    """)
DIAG = textwrap.dedent('''
    """diag(A) @ B (KernelBench level 1 problem 12)."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def forward(self, A, B):
            return torch.diag(A) @ B


    def get_inputs():
        return [torch.randn(SIZE), torch.randn(SIZE, SIZE)]


    def get_init_inputs():
        return []
    ''')
DIAG_KERNEL = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def diag_matmul_kernel(a_ptr, b_ptr, out_ptr, N, M, BLOCK_N: tl.constexpr,
                           BLOCK_M: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        a = tl.load(a_ptr + rows, mask=rows < N, other=0.0)
        mask = (rows[:, None] < N) & (cols[None, :] < M)
        offs = rows[:, None] * M + cols[None, :]
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, a[:, None] * b, mask=mask)


    class ModelNew(nn.Module):
        def forward(self, A, B):
            A, B = A.contiguous(), B.contiguous()
            N, M = B.shape
            out = torch.empty((N, M), device=B.device, dtype=B.dtype)
            grid = (triton.cdiv(N, 128), triton.cdiv(M, 2048))
            diag_matmul_kernel[grid](A, B, out, N, M, BLOCK_N=128, BLOCK_M=2048)
            return out
    """)


def one(kind: str, size: int, trials: int, cases: list[str] | None) -> dict:
    """One evaluation, in this process: its result and costs."""
    from stillroom.kernels import evaluate, validator

    problem = RELU.replace("ROWS", str(size)) if kind == "relu" else DIAG.replace("SIZE", str(size))
    kernel = RELU_KERNEL if kind == "relu" else DIAG_KERNEL
    channel_bytes = []
    plan = validator.channel.plan

    def measured(specs):  # the size of the channel, as the validator lays it out
        layout, size_ = plan(specs)
        channel_bytes.append(size_)
        return layout, size_

    validator.channel.plan = measured
    kwargs = {} if cases is None else {"cases": cases}
    start = time.perf_counter()
    r = evaluate(problem, kernel, trials=trials, timeout_s=1800, isolation="process", **kwargs)
    return {
        "problem": kind,
        "size": size,
        "reward": r.reward,
        "status": r.status,
        "cases": r.cases,
        "seconds": round(time.perf_counter() - start, 1),
        "data_mib": round(sum(channel_bytes) / 2**20),
        "validator_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "job_peak_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
        "reasons": r.reasons[:3],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relu-rows", type=int, nargs="*", default=[64, 128, 256])
    ap.add_argument("--diag", type=int, nargs="*", default=[4096])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--cases", nargs="*", default=None, help="default: every generated case")
    ap.add_argument("--one", nargs=2, metavar=("KIND", "SIZE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.trials, args.cases)))
        return
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    runs = [("relu", n) for n in args.relu_rows] + [("diag", n) for n in args.diag]
    for kind, size in runs:
        cmd = [sys.executable, __file__, "--one", kind, str(size), "--trials", str(args.trials)]
        if args.cases is not None:
            cmd += ["--cases", *args.cases]
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
        if proc.returncode:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            print(f"{kind} {size}: the validator process failed (exit {proc.returncode}): {tail}")
            continue
        print(proc.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
