"""Rule cost: the cost ledger, API tokens x price per teacher and effort, and GPU-hours per stage
x a rate, with totals; beside each, the estimate made from the config before the run
(stillroom/plan/estimate.py) and how far the run was off it.

Everything spent comes from the provenance sidecars of the artifacts given. GPU time is SLURM's
accounting when a job id was recorded and ``sacct`` answers (elapsed seconds x allocated GPUs),
else the job's wall time x the GPUs configured for its rule.
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from pydantic import Field

from ..config import ConfigError, Cost, Experiment, StageParams
from ..io import DataError, write_text
from ..plan import estimate
from ..plan.cluster import stage_gpus
from ..provenance.sidecars import WORKFLOW_ENV, read_sidecar
from .contract import stage


class Params(StageParams, Cost):
    config: dict[str, Any] | None = Field(
        None,
        description="the resolved experiment config, its local paths relative to the repository "
        "(the workflow's directory): the estimate the ledger is compared with (none: no estimate "
        "columns)",
    )


def job_params(exp: Experiment) -> Params:
    """The params of the cost job. GPUs per job follow the job shapes (plan/cluster.py); cost.gpus
    overrides them. The ledger sets the estimate made from the whole config (run in the cost job,
    not here) beside what was spent; the local files it counts stay relative to the repository as
    configured (the cost job resolves them against the workflow's directory), so the ledger's
    params name no checkout."""
    config = exp.dump()
    gpus = {**stage_gpus(config), **exp.cost.gpus}
    return Params(seed=exp.seed, **{**exp.cost.model_dump(), "gpus": gpus}, config=config)


def _rates(p: Cost) -> str:
    if not p.gpu_types:
        return f"at {p.gpu_hour_usd}/GPU-hour"
    return "per GPU-hour: " + ", ".join(
        f"{kind} {t.usd_per_hour:g}" for kind, t in p.gpu_types.items()
    )


def job_tokens(prov: Mapping[str, Any]) -> float | None:
    """A job's tokens as the estimate counts them: output tokens of generation and evaluation,
    tokens trained (the dataset's, once per epoch; with ``max_steps``, those the trainer counted)
    of training; None when it records neither."""
    metrics, params = prov.get("metrics", {}), prov.get("params", {})
    if prov["stage"] == "train" and "total_tokens" in metrics:
        if params.get("max_steps", -1) == -1:
            return metrics["total_tokens"] * params.get("epochs", 1)
        if "tokens_seen" in metrics:
            return metrics["tokens_seen"]
        # a sidecar from before tokens_seen: the rate times the time, which rounding makes jitter
        return round(metrics.get("tokens_per_second", 0) * metrics.get("train_seconds", 0))
    return metrics.get("completion_tokens")


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


def _job_gpus(prov: Mapping[str, Any], gpus_per_rule: Mapping[str, int]) -> int:
    """The GPUs a job held, from its rule's shape: a training phase with a layout of its own has
    its GPUs under train-<phase name>, another teacher than generation.teacher its generation
    jobs' under generate-<teacher>."""
    job = prov.get("params") or {}
    part = (job.get("phase") or {}).get("name") or (
        job.get("teacher") if prov["stage"] == "generate" else None
    )
    own_gpus = gpus_per_rule.get(f"{prov['rule']}-{part}") if part else None
    return gpus_per_rule.get(prov["rule"], 0) if own_gpus is None else own_gpus


def _server_key(server: Mapping[str, Any] | None) -> tuple | None:
    return tuple(server.get(k) for k in ("name", "host", "pid", "started")) if server else None


def _end(prov: Mapping[str, Any]) -> float:
    started = datetime.fromisoformat(prov["started_at"]).timestamp()
    return started + prov.get("metrics", {}).get("wall_s", 0.0)


def shared_servers(
    sidecars: list[Mapping[str, Any]],
    gpus_per_rule: Mapping[str, int],
    usage: Callable[[str], tuple[float, int] | None],
) -> dict[tuple, tuple[float, str]]:
    """Each client of a shared server (rules/serve.smk) -> its GPU-hours and their source: the
    server's allocation (sacct's, where its jobs share a SLURM job id; else the server's GPUs from
    its start to its last client's end), split among its clients by wall time. A client resumed
    whole never reached its server and is charged nothing."""
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for prov in sidecars:
        key = _server_key(prov.get("metrics", {}).get("server"))
        if key is not None:
            groups[key].append(prov)
    shares: dict[tuple, tuple[float, str]] = {}
    for key, clients in groups.items():
        job_ids = {c.get("slurm_job_id") for c in clients}
        measured = usage(next(iter(job_ids))) if len(job_ids) == 1 and None not in job_ids else None
        if measured:
            hours, source = measured[0] * measured[1] / 3600, "sacct (shared server)"
        else:
            start = datetime.fromisoformat(key[3]).timestamp()
            span = max(_end(c) for c in clients) - start
            hours, source = span * _job_gpus(clients[0], gpus_per_rule) / 3600, "server wall time"
        walls = [c.get("metrics", {}).get("wall_s", 0.0) for c in clients]
        for client, wall in zip(clients, walls, strict=True):
            share = wall / sum(walls) if sum(walls) > 0 else 1 / len(clients)
            shares[_client_key(client)] = (hours * share, source)
    return shares


def _client_key(prov: Mapping[str, Any]) -> tuple:
    return (prov["rule"], tuple(sorted(prov["outputs"].values())))


def ledger(
    artifacts: Mapping[str, str],
    params: Mapping[str, Any] | Params,
    usage: Callable[[str], tuple[float, int] | None] = slurm_usage,
) -> dict[str, list[dict[str, Any]]]:
    """API rows per (teacher, effort) and GPU rows per rule; one job writing several outputs counts
    once. A job is known by the outputs its sidecars name (never by its start time: two jobs of a
    rule can start in the same millisecond)."""
    api: dict[tuple[str, str], dict[str, float]] = defaultdict(
        lambda: {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "jobs": 0}
    )
    gpu: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"jobs": 0, "gpu_hours": 0.0, "tokens": None, "source": set()}
    )
    seen = set()
    p = Params.parse(params, where="cost")
    gpus_per_rule = p.gpus
    sidecars = []
    for path in artifacts.values():
        prov = read_sidecar(path)
        job = (prov["rule"], tuple(sorted(prov["outputs"].values())))
        if job not in seen:
            seen.add(job)
            sidecars.append(prov)
    # Jobs run inside one allocation (salloc, or snakemake within an sbatch) share its SLURM job id,
    # and sacct would bill each of them the whole allocation: take sacct only for ids that belong to
    # one job.
    ids = [p.get("slurm_job_id") for p in sidecars if p.get("slurm_job_id")]
    own = {i for i in ids if ids.count(i) == 1}
    served = shared_servers(sidecars, gpus_per_rule, usage)
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
        if "server" in metrics:
            # a client of a shared server: its share (by wall time) of that server's allocation
            hours, source = served.get(_client_key(prov), (0.0, "resumed, no request"))
            seconds, n_gpus = hours * 3600, 1
        elif measured:
            seconds, n_gpus = measured
            source = "sacct"
        else:
            seconds, n_gpus = metrics.get("wall_s", 0.0), _job_gpus(prov, gpus_per_rule)
            source = "wall time"
        g = gpu[prov["rule"]]
        g["jobs"] += 1
        g["gpu_hours"] += seconds * n_gpus / 3600
        tokens = job_tokens(prov)
        if tokens is not None:
            g["tokens"] = (g["tokens"] or 0) + tokens
        g["source"].add(source)
    api_rows = [
        {"teacher": t, "effort": e, **{k: round(v, 4) for k, v in row.items()}}
        for (t, e), row in sorted(api.items())
    ]
    gpu_rows = [
        {
            "rule": rule,
            "jobs": g["jobs"],
            "tokens": g["tokens"],
            "gpu_hours": round(g["gpu_hours"], 4),
            "cost_usd": round(g["gpu_hours"] * p.gpu_rate(rule), 2),
            "source": "+".join(sorted(g["source"])),
        }
        for rule, g in sorted(gpu.items())
    ]
    return {"api": api_rows, "gpu": gpu_rows}


def off(actual: float | None, estimated: float | None) -> float | None:
    """How far the run was off its estimate: (actual - estimated) / estimated."""
    if actual is None or estimated is None or estimated == 0:
        return None
    return (actual - estimated) / estimated


def _vs(estimated: float | None, actual: float | None, fmt: str) -> str:
    """An estimate's cell: the estimated value and how far the actual one was off it."""
    if estimated is None:
        return "–"
    error = off(actual, estimated)
    if error is None:
        return format(estimated, fmt)
    return f"{format(estimated, fmt)} ({error:+.0%}, ×{1 + error:.2f})"


def compared(
    rows: Mapping[str, list[dict[str, Any]]], bill: estimate.Bill
) -> dict[str, list[dict[str, Any]]]:
    """The ledger's rows with the estimate of each beside them (None where it has none): output
    tokens and API dollars per (teacher, effort), tokens, GPU-hours and GPU dollars per rule."""
    api_est, rule_est = bill.by_teacher_effort(), bill.by_rule()

    def rounded(value: float | None, digits: int | None = None) -> float | None:
        return None if value is None else round(value, digits)

    api = []
    for r in rows["api"]:
        e = api_est.get((r["teacher"], r["effort"]), {})
        api.append(
            {
                **r,
                "est_output_tokens": rounded(e.get("output_tokens")),
                "est_cost_usd": rounded(e.get("api_usd"), 4),
            }
        )
    gpu = []
    for r in rows["gpu"]:
        e = rule_est.get(r["rule"], {})
        gpu.append(
            {
                **r,
                "est_tokens": rounded(e.get("tokens")),
                "est_gpu_hours": rounded(e.get("gpu_hours"), 4),
                "est_cost_usd": rounded(e.get("gpu_usd"), 2),
            }
        )
    return {"api": api, "gpu": gpu}


@stage(
    "cost",
    params=Params,
    inputs=("artifacts*",),
    outputs=("markdown", "csv", "html"),
    help="the cost ledger: API tokens x price per teacher and effort, GPU-hours per stage x rate",
)
def run(
    *,
    artifacts: Mapping[str, str],
    out_markdown: str,
    out_csv: str,
    out_html: str | None = None,
    params: Mapping[str, Any] | Params,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    p = Params.parse(params, where="cost")
    rows = ledger(artifacts, p)
    bill, why_not = None, None
    if p.config is not None:
        # charged at the ledger's own rate and GPUs per rule
        rates = {
            key: getattr(p, key)
            for key in ("gpu_hour_usd", "gpu_types", "gpu_type", "gpu_type_by_rule", "gpus")
        }
        rates["gpu_types"] = {k: t.dump() for k, t in p.gpu_types.items()}
        config = {**p.config, "cost": {**p.config.get("cost", {}), **rates}}
        try:
            # the config's local files are relative to the repository: the workflow's directory
            bill = estimate.bill(config, root=os.environ.get(WORKFLOW_ENV) or ".")
        except (ConfigError, DataError) as exc:  # a missing figure never costs the run its ledger
            why_not = str(exc)
    if bill:
        rows = compared(rows, bill)
    api_total = sum(r["cost_usd"] for r in rows["api"])
    gpu_total = sum(r["cost_usd"] for r in rows["gpu"])
    total = api_total + gpu_total
    est_total = None
    if bill:
        # the estimate of the rules and teachers the ledger has rows for
        est_total = sum(r["est_cost_usd"] or 0 for r in rows["api"] + rows["gpu"])
    est_api = " est. output tokens | est. API $ |" if bill else ""
    lines = [
        "### Cost ledger",
        "",
        "| teacher | effort | jobs | input tokens | output tokens | API $ |" + est_api,
        "|---|---|---|---|---|---|" + ("---|---|" if bill else ""),
    ]
    for r in rows["api"]:
        line = (
            f"| {r['teacher']} | {r['effort']} | {r['jobs']} | {r['prompt_tokens']:,.0f} | "
            f"{r['completion_tokens']:,.0f} | {r['cost_usd']:.2f} |"
        )
        if bill:
            line += (
                f" {_vs(r['est_output_tokens'], r['completion_tokens'], ',.0f')} |"
                f" {_vs(r['est_cost_usd'], r['cost_usd'], ',.2f')} |"
            )
        lines.append(line)
    est_gpu = " est. tokens | est. GPU-hours | est. GPU $ |" if bill else ""
    lines += [
        "",
        f"| stage | jobs | tokens | GPU-hours | GPU $ ({_rates(p)}) | from |" + est_gpu,
        "|---|---|---|---|---|---|" + ("---|---|---|" if bill else ""),
    ]
    for r in rows["gpu"]:
        tokens = "–" if r["tokens"] is None else f"{r['tokens']:,.0f}"
        line = (
            f"| {r['rule']} | {r['jobs']} | {tokens} | {r['gpu_hours']:.3f} | "
            f"{r['cost_usd']:.2f} | {r['source']} |"
        )
        if bill:
            line += (
                f" {_vs(r['est_tokens'], r['tokens'], ',.0f')} |"
                f" {_vs(r['est_gpu_hours'], r['gpu_hours'], '.3f')} |"
                f" {_vs(r['est_cost_usd'], r['cost_usd'], '.2f')} |"
            )
        lines.append(line)
    line = f"**Total: ${total:,.2f}** (API ${api_total:,.2f} + GPU ${gpu_total:,.2f})"
    if est_total is not None:
        line += f"; estimated before the run: ${_vs(est_total, total, ',.2f')}"
    lines += ["", line]
    if bill:
        lines += [
            "",
            "est.: the estimate from the config before the run (`stillroom estimate`, figures "
            "in cost.estimate), then how far the run was off it: (actual - estimated) / "
            "estimated, and actual / estimated. Tokens: output tokens of generation and "
            "evaluation, tokens trained of training.",
        ]
    elif why_not:
        lines += ["", f"No estimate: {why_not}"]
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
            "tokens",
            "est_tokens",
            "est_gpu_hours",
            "est_cost_usd",
        ]
    )

    def blank(v: Any) -> Any:
        return "" if v is None else v

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
                r["completion_tokens"],
                blank(r.get("est_output_tokens")),
                "",
                blank(r.get("est_cost_usd")),
            ]
        )
    for r in rows["gpu"]:
        writer.writerow(
            [
                "gpu",
                r["rule"],
                "",
                r["jobs"],
                "",
                "",
                r["gpu_hours"],
                r["cost_usd"],
                r["source"],
                blank(r["tokens"]),
                blank(r.get("est_tokens")),
                blank(r.get("est_gpu_hours")),
                blank(r.get("est_cost_usd")),
            ]
        )
    writer.writerow(
        ["total", "", "", "", "", "", "", round(total, 2), "", "", "", "", blank(est_total)]
    )
    write_text(out_markdown, "\n".join(lines) + "\n")
    write_text(out_csv, buf.getvalue())
    if out_html:
        from ..analysis.tables import render

        # the resolved config is the report's configuration file already: not repeated here
        page = render.html("\n".join(lines) + "\n", p.model_dump(mode="json", exclude={"config"}))
        write_text(out_html, page)
    log("\n" + "\n".join(lines))
    metrics: dict[str, Any] = {"api_usd": round(api_total, 2), "gpu_usd": round(gpu_total, 2)}
    if est_total is not None:
        metrics["estimated_usd"] = round(est_total, 2)
    return metrics
