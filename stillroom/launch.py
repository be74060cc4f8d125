"""How a training job is laid out and started: processes, nodes, FSDP2 sizes, device_map model parallel.

One launcher serves the train rule everywhere. World size 1 trains in the calling process. Otherwise
the stage re-runs itself as ``python -m stillroom.launch`` workers: under SLURM one ``srun`` task per
node (``--ntasks-per-node=1``) starts ``torchrun`` with the allocation's node count, rendezvous (c10d)
on the allocation's first host and a port derived from the job id, so two jobs sharing a node never
collide; on one node (under SLURM or not) a local ``torchrun --standalone``. Sharding is transformers' own load-time
FSDP2 (``DistributedConfig``): the Trainer then neither wraps the DTensor model in DDP nor shards it
again, and unlike accelerate's FSDP it also runs on CPU with gloo (measured).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

DISTRIBUTED_DEFAULTS = {"nodes": 1, "gpus_per_node": 1, "fsdp_size": None, "dp_replicate_size": 1}
BASE_PORT, PORT_RANGE = 20000, 30000


def check_distributed(params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``train.distributed`` and the device_map keys against each other; return the layout."""
    dist = params.get("distributed") or {}
    unknown = sorted(set(dist) - set(DISTRIBUTED_DEFAULTS))
    if unknown:
        raise ValueError(
            f"train.distributed: unknown key(s) {', '.join(unknown)} "
            f"(known: {', '.join(DISTRIBUTED_DEFAULTS)})"
        )
    d = {**DISTRIBUTED_DEFAULTS, **dist}
    for key in ("nodes", "gpus_per_node", "dp_replicate_size"):
        if isinstance(d[key], bool) or not isinstance(d[key], int) or d[key] < 1:
            raise ValueError(f"train.distributed.{key} must be an int >= 1, got {d[key]!r}")
    device_map = params.get("device_map")
    if (
        device_map is not None
    ):  # model parallel: one process spreads the layers over the node's GPUs
        if d["nodes"] != 1 or dist.get("fsdp_size") or d["dp_replicate_size"] != 1:
            raise ValueError(
                "train.device_map model parallel runs as one process on one node, spreading layers "
                "over train.distributed.gpus_per_node GPUs: set nodes 1 and no fsdp_size / "
                "dp_replicate_size"
            )
        d.update(fsdp_size=1, world_size=1)
    else:
        world = d["nodes"] * d["gpus_per_node"]
        if d["fsdp_size"] is None:
            if world % d["dp_replicate_size"]:
                raise ValueError(
                    f"train.distributed.dp_replicate_size {d['dp_replicate_size']} does not divide the "
                    f"world size {world} (nodes {d['nodes']} x gpus_per_node {d['gpus_per_node']})"
                )
            d["fsdp_size"] = world // d["dp_replicate_size"]
        if d["fsdp_size"] * d["dp_replicate_size"] != world:
            raise ValueError(
                f"train.distributed: fsdp_size {d['fsdp_size']} x dp_replicate_size "
                f"{d['dp_replicate_size']} must equal the world size {world} "
                f"(nodes {d['nodes']} x gpus_per_node {d['gpus_per_node']})"
            )
        d["world_size"] = world

    limit, max_memory = params.get("gpu_memory_limit"), params.get("max_memory")
    if limit is not None and max_memory is not None:
        raise ValueError(
            "train.gpu_memory_limit and train.max_memory are exclusive: the limit sets max_memory "
            "for every GPU; give one of them"
        )
    if (limit is not None or max_memory is not None) and device_map is None:
        raise ValueError(
            "train.gpu_memory_limit / train.max_memory only apply with train.device_map (model parallel)"
        )
    if (
        params.get("load_in_4bit")
        and d["world_size"] > 1
        and (dist.get("fsdp_size") or d["dp_replicate_size"] > 1)
    ):
        raise ValueError(
            "train.distributed.fsdp_size / dp_replicate_size with load_in_4bit: 4-bit weights cannot be "
            "FSDP-sharded here, QLoRA processes are data-parallel replicas (or use train.device_map)"
        )
    return d


def sharded(params: Mapping[str, Any], layout: Mapping[str, Any]) -> bool:
    """FSDP2 shards full-precision models. A 4-bit one cannot be (bitsandbytes' packed NF4 parameters do not
    survive the DTensor conversion, measured), so QLoRA processes are data-parallel replicas (DDP)."""
    return layout["world_size"] > 1 and not params.get("load_in_4bit")


def load_kwargs(params: Mapping[str, Any], layout: Mapping[str, Any]) -> dict[str, Any]:
    """Extra ``from_pretrained`` arguments: the FSDP2 mesh for several processes, or a device map."""
    if sharded(params, layout):
        import torch
        from transformers.distributed import DistributedConfig

        # On GPU, FSDP2 computes in bf16 over float32 shards (mixed precision); gloo on CPU stays float32.
        return {
            "distributed_config": DistributedConfig(
                fsdp_size=layout["fsdp_size"],
                dp_replicate_size=layout["dp_replicate_size"],
                fsdp_mixed_precision=torch.cuda.is_available(),
            )
        }
    if params.get("device_map") is None:
        return {}
    kwargs: dict[str, Any] = {"device_map": params["device_map"]}
    if params.get("gpu_memory_limit") is not None:
        import torch

        kwargs["max_memory"] = {
            i: params["gpu_memory_limit"] for i in range(torch.cuda.device_count())
        }
    elif params.get("max_memory") is not None:
        kwargs["max_memory"] = {
            int(k) if str(k).isdigit() else k: v for k, v in params["max_memory"].items()
        }
    return kwargs


def gather_state(model) -> dict:
    """The full state dict of an FSDP2-sharded model, on CPU; every rank must call it (it all-gathers)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def unsharded(model, state: dict):
    """A plain single-process copy of ``model`` holding ``state``. Saving the sharded model itself writes
    tied weights twice (transformers 5.24), which later merges would reject as a different architecture."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    config.distributed_config = None
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    plain.load_state_dict(state, assign=True)
    plain.tie_weights()
    plain.generation_config = (
        model.generation_config
    )  # from_config would derive a bare one from config.json
    return plain


def in_worker() -> bool:
    """True inside a process started by torchrun."""
    return "LOCAL_RANK" in os.environ


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def job_port(job: str) -> int:
    """A rendezvous port per (SLURM job, launcher): jobs sharing a node do not collide."""
    return BASE_PORT + int(hashlib.sha256(job.encode()).hexdigest(), 16) % PORT_RANGE


def slurm_allocation(job_id: str) -> tuple[int, list[str]]:
    """Node count and host names of a running SLURM job, from scontrol. Not from the environment: the
    executor's job step keeps only SLURM_JOB_ID of the allocation's variables."""

    def scontrol(*args: str) -> str:
        return subprocess.run(
            ["scontrol", *args], check=True, capture_output=True, text=True
        ).stdout

    fields = dict(
        kv.split("=", 1) for kv in scontrol("show", "job", "-o", job_id).split() if "=" in kv
    )
    return int(fields["NumNodes"].split("-")[0]), scontrol(
        "show", "hostnames", fields["NodeList"]
    ).split()


def command(
    layout: Mapping[str, Any],
    worker: list[str],
    env: Mapping[str, str] = os.environ,
    cpus: int = 1,
    allocation: Callable[[str], tuple[int, list[str]]] = slurm_allocation,
) -> list[str]:
    """The command that starts ``worker`` on every process of ``layout``, with ``cpus`` CPUs per node."""
    nproc = f"--nproc-per-node={layout['gpus_per_node']}"
    torchrun = [sys.executable, "-m", "torch.distributed.run"]  # torchrun of this very environment
    if layout["nodes"] == 1:
        # One node needs no srun, under SLURM or not: the job (or the executor's one-task step around
        # the rule) already holds the node's GPUs, and a nested srun would wait for the step's own CPUs.
        return [*torchrun, "--standalone", "--nnodes=1", nproc, *worker]
    if "SLURM_JOB_ID" not in env:
        raise ValueError(
            f"train.distributed.nodes is {layout['nodes']} but this is not a SLURM job: multi-node "
            "training runs under sbatch (snakemake --profile profiles/slurm)"
        )
    job = f"{env['SLURM_JOB_ID']}-{os.getpid()}"  # two trainings in one allocation: two rendezvous
    nodes, hosts = allocation(env["SLURM_JOB_ID"])
    if nodes != layout["nodes"]:
        raise ValueError(
            f"train.distributed.nodes is {layout['nodes']} but SLURM job {env['SLURM_JOB_ID']} "
            f"has {nodes} node(s)"
        )
    # The step gets all of the job's GPUs by default, but only one CPU per task unless told.
    return [
        "srun",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cpus}",
        "--kill-on-bad-exit=1",
        *torchrun,
        f"--nnodes={nodes}",
        nproc,
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={hosts[0]}:{job_port(job)}",
        f"--rdzv-id={job}",
        *worker,
    ]


def _terminate_with_parent() -> None:
    """SIGTERM torchrun (or srun) if this process dies, even by SIGKILL: torchrun then stops its workers,
    which run in sessions of their own and would otherwise train on and write the output unowned."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def spawn(
    layout: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    log: Callable[[str], Any],
    cpus: int = 1,
    target: str = "stillroom.train:train_sft",
) -> dict[str, Any]:
    """Run ``target(**kwargs)`` (a "module:function" whose kwargs include ``out_dir``) on every process of
    ``layout``; return rank 0's metrics.

    The spec and the metrics live beside the output, on the filesystem every node shares (a node-local
    /tmp would not reach the other nodes, nor necessarily the node where global rank 0 runs)."""
    beside = Path(str(kwargs["out_dir"]).rstrip("/")).parent
    beside.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".launch-", dir=beside) as tmp:
        spec, metrics = Path(tmp) / "spec.json", Path(tmp) / "metrics.json"
        spec.write_text(json.dumps({**kwargs, "metrics": str(metrics), "target": target}))
        cmd = command(
            layout, ["-m", "stillroom.launch", str(spec)], cpus=cpus
        )  # torchrun runs a module with -m
        log(f"launching {layout['world_size']} processes: {shlex.join(cmd)}")
        # The workers' stderr goes straight to ours, which the rule's log collects.
        done = subprocess.run(
            cmd,
            check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=_terminate_with_parent,
        )
        if done.returncode:
            raise RuntimeError(
                f"workers failed with exit status {done.returncode}: {shlex.join(cmd)}"
            )
        return json.loads(metrics.read_text())


def _worker(spec_path: str) -> None:
    import importlib

    from stillroom.io import write_json

    spec = json.loads(Path(spec_path).read_text())
    metrics_path = spec.pop("metrics")
    module, _, function = spec.pop("target").partition(":")
    prefix = f"[rank {rank()}] "
    metrics = getattr(importlib.import_module(module), function)(
        **spec, log=lambda msg: print(prefix + msg, file=sys.stderr, flush=True)
    )
    if rank() == 0:
        write_json(metrics_path, metrics)


if __name__ == "__main__":
    _worker(sys.argv[1])
