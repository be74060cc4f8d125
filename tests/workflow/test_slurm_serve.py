"""Serve once, use many, under profiles/slurm on the local cluster (scripts/slurm-up.sh): a
self-hosted teacher (the fault-injection server run as a program, a real HTTP server) with
generation.servers 2 serves the generation jobs of its shards. Each server is one sbatch allocation
holding the server and its clients at once; the servers started are the plan's (Plan.services),
counted from their jobs' logs; no server outlives the run; a client records the server it used."""

import json
import subprocess
import sys

import pytest

from stillroom.config import Experiment
from stillroom.plan.dag import Plan

from ..conftest import REPO, small_config, wait_snakemake
from .test_slurm import FAST, sacct, start_command

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

MARKER = "stillroom-slurm-serve-test"


def served_config() -> dict:
    cfg = small_config()
    cfg["experiment"] = "slurm-serve"
    cfg["generation"].update(teacher="selfhost", shards=4, servers=2)
    server = f"{{python}} {REPO / 'tests' / 'fault_server.py'} {{port}} 1 {MARKER}"
    cfg["teachers"]["selfhost"] = {
        "backend": "sglang",
        "model": "stand-in",
        "concurrency": 4,
        "server": {"command": server, "startup_timeout_s": 120},
    }
    return cfg


@pytest.fixture(scope="module")
def served_run(cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slurm-serve")
    cfg = served_config()
    (workdir / "config.yaml").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory"]
    cmd += [str(workdir), *FAST, "--configfile", str(workdir / "config.yaml")]
    cmd += ["--until", "generate"]
    proc = wait_snakemake(start_command(workdir, cmd))
    root = workdir / "results" / "slurm-serve"
    return workdir, cfg, proc, root


def test_each_server_is_one_allocation_for_its_clients_and_starts_once(served_run):
    workdir, cfg, proc, root = served_run
    plan = Plan(Experiment.parse(cfg), Experiment.parse(cfg).dump(), REPO)
    services = plan.services()
    assert len(services) == 2  # generation.servers; the default eval backend is in process
    # the starts, from the servers' own logs: one each
    logs = sorted((root / "logs" / "serve").glob("*.log"))
    starts = [log.read_text().count("healthy after") for log in logs]
    assert starts == [1, 1], [log.read_text()[-2000:] for log in logs]
    sidecars = [json.loads(p.read_text()) for p in (root / "gen").rglob("*.jsonl.prov.json")]
    assert len(sidecars) == 2 * 4  # two efforts on four shards
    # shard i is a client of server i mod 2: two allocations, each holding its four clients
    by_job: dict[str, set] = {}
    for prov in sidecars:
        server = prov["metrics"]["server"]
        shard = int(prov["outputs"]["samples"].rsplit("shard-", 1)[1][:5])
        assert server["name"] == f"teacher:selfhost/{shard % 2:03d}"
        by_job.setdefault(prov["slurm_job_id"], set()).add(server["name"])
    assert len(by_job) == 2 and all(len(names) == 1 for names in by_job.values())
    rows = sacct(set(by_job), "JobIDRaw", "State", "Partition", "AllocTRES")
    assert {r["State"] for r in rows} == {"COMPLETED"} and {r["Partition"] for r in rows} == {"gpu"}
    # the group asks its server's shape: one GPU, not one per client
    assert all("gres/gpu=1" in r["AllocTRES"] for r in rows), rows
    # the service file goes with its server; nothing of it is an artifact input
    assert not list((root / "serve").rglob("*.json"))
    assert all("server" not in prov["inputs"] for prov in sidecars)


def test_no_server_outlives_the_run(served_run):
    left = subprocess.run(
        ["pgrep", "-f", f"fault_server.py [0-9]+ 1 {MARKER}"], capture_output=True
    )
    assert left.stdout == b"", left.stdout
