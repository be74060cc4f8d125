"""Rule cost: the cost ledger, API tokens x price per teacher and effort, and GPU-hours per stage
x a rate, with totals.

Everything comes from the provenance sidecars of the artifacts given. GPU time is SLURM's
accounting when a job id was recorded and ``sacct`` answers (elapsed seconds x allocated GPUs),
else the job's wall time x the GPUs configured for its rule.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from ..config import Cost
from ..io import write_text
from ..provenance import read_sidecar


class Params(Cost):
    seed: int = 0


def parse_sacct(text: str) -> tuple[float, int] | None:
    """(elapsed seconds, GPUs) from ``sacct -X -n -P -o ElapsedRaw,AllocTRES`` output."""
    for line in text.splitlines():
        elapsed, _, tres = line.partition("|")
        if elapsed.strip().isdigit():
            gpus = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", tres)
            return float(elapsed), int(gpus.group(1)) if gpus else 0
    return None


def slurm_usage(job_id: str) -> tuple[float, int] | None:
    if not shutil.which("sacct"):
        return None
    try:
        out = subprocess.run(
            ["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "ElapsedRaw,AllocTRES"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return parse_sacct(out.stdout)


def ledger(
    artifacts: Mapping[str, str],
    params: Mapping[str, Any] | Params,
    usage: Callable[[str], tuple[float, int] | None] = slurm_usage,
) -> dict[str, list[dict[str, Any]]]:
    """API rows per (teacher, effort) and GPU rows per rule; one job writing several outputs counts
    once."""
    api: dict[tuple[str, str], dict[str, float]] = defaultdict(
        lambda: {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "jobs": 0}
    )
    gpu: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"jobs": 0, "gpu_hours": 0.0, "source": set()}
    )
    seen = set()
    p = Params.parse(params, where="cost")
    rate, gpus_per_rule = p.gpu_hour_usd, p.gpus
    sidecars = []
    for path in artifacts.values():
        prov = read_sidecar(path)
        job = (prov["rule"], prov["started_at"], prov.get("host"))
        if job not in seen:
            seen.add(job)
            sidecars.append(prov)
    # Jobs run inside one allocation (salloc, or snakemake within an sbatch) share its SLURM job id,
    # and sacct would bill each of them the whole allocation: take sacct only for ids that belong to
    # one job.
    ids = [p.get("slurm_job_id") for p in sidecars if p.get("slurm_job_id")]
    own = {i for i in ids if ids.count(i) == 1}
    for prov in sidecars:
        metrics = prov.get("metrics", {})
        if prov["stage"] == "generate":
            job_params = prov["params"]
            for effort in job_params.get("efforts") or [job_params.get("effort")]:
                m = (
                    metrics.get("per_effort", {}).get(effort, metrics)
                    if job_params.get("efforts")
                    else metrics
                )
                row = api[(job_params.get("teacher", "?"), str(effort))]
                for key in ("prompt_tokens", "completion_tokens", "cost_usd"):
                    row[key] += m.get(key, 0)
                row["jobs"] += 1
        measured = usage(prov["slurm_job_id"]) if prov.get("slurm_job_id") in own else None
        if measured:
            seconds, n_gpus = measured
            source = "sacct"
        else:
            seconds, n_gpus, source = (
                metrics.get("wall_s", 0.0),
                gpus_per_rule.get(prov["rule"], 0),
                "wall time",
            )
        g = gpu[prov["rule"]]
        g["jobs"] += 1
        g["gpu_hours"] += seconds * n_gpus / 3600
        g["source"].add(source)
    api_rows = [
        {"teacher": t, "effort": e, **{k: round(v, 4) for k, v in row.items()}}
        for (t, e), row in sorted(api.items())
    ]
    gpu_rows = [
        {
            "rule": rule,
            "jobs": g["jobs"],
            "gpu_hours": round(g["gpu_hours"], 4),
            "cost_usd": round(g["gpu_hours"] * rate, 2),
            "source": "+".join(sorted(g["source"])),
        }
        for rule, g in sorted(gpu.items())
    ]
    return {"api": api_rows, "gpu": gpu_rows}


def run(
    *,
    artifacts: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    params: Mapping[str, Any] | Params,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    p = Params.parse(params, where="cost")
    rows = ledger(artifacts, p)
    api_total = sum(r["cost_usd"] for r in rows["api"])
    gpu_total = sum(r["cost_usd"] for r in rows["gpu"])
    lines = [
        "### Cost ledger",
        "",
        "| teacher | effort | jobs | input tokens | output tokens | API $ |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['teacher']} | {r['effort']} | {r['jobs']} | {r['prompt_tokens']:,.0f} | "
        f"{r['completion_tokens']:,.0f} | {r['cost_usd']:.2f} |"
        for r in rows["api"]
    ]
    lines += [
        "",
        f"| stage | jobs | GPU-hours | GPU $ (at {p.gpu_hour_usd}/GPU-hour) | from |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['rule']} | {r['jobs']} | {r['gpu_hours']:.3f} | {r['cost_usd']:.2f} "
        f"| {r['source']} |"
        for r in rows["gpu"]
    ]
    lines += [
        "",
        f"**Total: ${api_total + gpu_total:,.2f}** (API ${api_total:,.2f} + GPU ${gpu_total:,.2f})",
    ]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(
        [
            "kind",
            "name",
            "effort",
            "jobs",
            "input_tokens",
            "output_tokens",
            "gpu_hours",
            "cost_usd",
            "source",
        ]
    )
    for r in rows["api"]:
        writer.writerow(
            [
                "api",
                r["teacher"],
                r["effort"],
                r["jobs"],
                r["prompt_tokens"],
                r["completion_tokens"],
                "",
                r["cost_usd"],
                "provenance",
            ]
        )
    for r in rows["gpu"]:
        writer.writerow(
            ["gpu", r["rule"], "", r["jobs"], "", "", r["gpu_hours"], r["cost_usd"], r["source"]]
        )
    writer.writerow(["total", "", "", "", "", "", "", round(api_total + gpu_total, 2), ""])
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())
    log("\n" + "\n".join(lines))
    return {"api_usd": round(api_total, 2), "gpu_usd": round(gpu_total, 2)}
