"""Check ``evaluate``: the evaluate stage with the ``hf`` backend on the GPU."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from ..io import write_jsonl
from .common import Log, mib, verdict


def check_evaluate(
    base_dir: str,
    *,
    device: str,
    problems: int,
    samples: int,
    max_new_tokens: int,
    seed: int = 0,
    log: Log = print,
) -> dict[str, Any]:
    """The evaluate stage, ``hf`` backend, on generated arithmetic problems."""
    import torch

    from ..data.sources import generate
    from ..io import read_jsonl
    from ..stages import evaluate

    cuda = device == "cuda"
    rows = [
        {"prompt": r["prompt"], "answer": r["answer"], "kind": r["kind"]}
        for r in generate("arithmetic", "gpu-check", problems, seed, max_operand=99)
    ]
    params = {
        "model_name": "gpu-check",
        "benchmark": "gpu-check",
        "samples": samples,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": max_new_tokens,
        "batch_size": problems * samples,
        "effort": None,
        "effort_tag": "{reasoning effort: $effort}",
        "backend": {"backend": "hf"},
        "seed": seed,
    }
    with tempfile.TemporaryDirectory(prefix="gpu-check-eval-") as tmp:
        bench, out_path = Path(tmp) / "problems.jsonl", Path(tmp) / "samples.jsonl"
        write_jsonl(bench, rows)
        before = torch.cuda.memory_allocated() if cuda else 0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        metrics = evaluate.run(
            model=str(base_dir),
            problems=str(bench),
            out_samples=str(out_path),
            params=params,
            log=log,
        )
        seconds = time.perf_counter() - start
        written = read_jsonl(out_path)
    # A fresh process: GPU memory allocated during the stage means the model ran there.
    used = torch.cuda.max_memory_allocated() - before if cuda else None
    failures = []
    if len(written) != problems * samples:
        failures.append(f"{len(written)} samples written, {problems * samples} expected")
    if not any(r["completion_tokens"] for r in written):
        failures.append("no completion tokens generated")
    if cuda and not used:
        failures.append("no GPU memory was allocated: the hf backend did not run on the GPU")
    return verdict(
        failures,
        problems=problems,
        samples_written=len(written),
        completion_tokens=metrics["completion_tokens"],
        tokens_per_s=metrics["tokens_per_s"],
        stage_s=round(seconds, 2),
        gpu_memory_mib=mib(used) if cuda else None,
    )
