"""How a training job is started on the processes of its layout (stillroom.config.Layout: nodes,
GPUs, FSDP2 sizes, or one device_map process).

One launcher serves the train and grpo rules everywhere. World size 1 trains in the calling
process. Otherwise the training body's own module runs as the workers (``python -m
stillroom.runtime.sft``, or ``.grpo``), its ``__main__`` block handing the body to ``serve``: a
child process is started by a module name, so the body's module is that entry point, and nothing
is imported by a string. Under SLURM one ``srun`` task per node (``--ntasks-per-node=1``) starts
``torchrun`` with the allocation's node count, rendezvous (c10d) on the allocation's first host
and a port derived from the job id, so two jobs sharing a node never collide; on one node (under
SLURM or not) a local ``torchrun --standalone``. Sharding is transformers' own load-time FSDP2
(``DistributedConfig``): the Trainer then neither wraps the DTensor model in DDP nor shards it
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

from ..config import Grpo, Layout, Train

BASE_PORT, PORT_RANGE = 20000, 30000


def load_kwargs(params: Train | Grpo) -> dict[str, Any]:
    """Extra ``from_pretrained`` arguments: the FSDP2 mesh for several processes (with the
    experts split over each FSDP group's ranks under expert parallelism), or a device map."""
    layout = params.layout
    if params.sharded:
        import torch
        from transformers.distributed import DistributedConfig

        # On GPU, FSDP2 computes in bf16 over float32 shards (mixed precision); gloo on CPU stays
        # float32.
        return {
            "distributed_config": DistributedConfig(
                fsdp_size=layout.fsdp_size,
                dp_replicate_size=layout.dp_replicate_size,
                # experts split over the ranks of each FSDP group, reached by all-to-all
                ep_size=layout.expert_parallel_size,
                fsdp_mixed_precision=torch.cuda.is_available(),
            )
        }
    if not isinstance(params, Train) or params.device_map is None:
        return {}
    import torch

    kwargs: dict[str, Any] = {"device_map": params.device_map}
    # in bytes: gpu_memory_limit's int is GiB, which transformers would read as bytes
    if memory := params.max_memory_bytes(torch.cuda.device_count()):
        kwargs["max_memory"] = memory
    return kwargs


def fsdp_mesh(layout: Layout, cuda: bool):
    """The device mesh FSDP2 shards over for ``layout``, on this torchrun worker (the process group
    started here when nothing has started it): one dimension of fsdp_size, or (replicas,
    fsdp_size) for HSDP, whose shards then stay within a node and only the gradient all-reduce
    crosses nodes. transformers builds the same from ``DistributedConfig``; the staged NF4 loader
    builds its model itself and takes this one."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    if layout.dp_replicate_size == 1:
        shape, names = (layout.fsdp_size,), ("dp_shard",)
    else:
        shape, names = (layout.dp_replicate_size, layout.fsdp_size), ("dp_replicate", "dp_shard")
    return init_device_mesh("cuda" if cuda else "cpu", shape, mesh_dim_names=names)


def gather_state(model) -> dict:
    """The full state dict of an FSDP2-sharded model, on CPU; every rank must call it (it
    all-gathers)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def unsharded(model, state: dict):
    """A plain single-process copy of ``model`` holding ``state``. Saving the sharded model itself
    writes tied weights twice (transformers 5.24), which later merges would reject as a different
    architecture."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    config.distributed_config = None
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    plain.load_state_dict(state, assign=True)
    plain.tie_weights()
    # from_config would derive a bare one from config.json
    plain.generation_config = model.generation_config
    return plain


def peak_memory_mib() -> dict[str, list[float] | None]:
    """Every process's peak memory so far in MiB, in rank order: host RSS (the kernel's high-water
    mark, Linux) and, with CUDA, the most torch's allocator held on the process's GPU (None
    without). Under torch.distributed every rank must call it (it all-gathers)."""
    import resource

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    mine = {
        "host_rss": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "gpu": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
    }
    every = [mine]
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
    return {
        "host_rss": [m["host_rss"] for m in every],
        "gpu": [m["gpu"] for m in every] if cuda else None,
    }


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def job_port(job: str) -> int:
    """A rendezvous port per (SLURM job, launcher): jobs sharing a node do not collide."""
    return BASE_PORT + int(hashlib.sha256(job.encode()).hexdigest(), 16) % PORT_RANGE


def slurm_allocation(job_id: str) -> tuple[int, list[str]]:
    """Node count and node addresses of a running SLURM job, from scontrol. Not from the
    environment: the executor's job step keeps only SLURM_JOB_ID of the allocation's variables. A
    node's address is the one SLURM itself reaches it at (NodeAddr, the node's name unless the
    cluster sets one): a node's name need not resolve."""

    def scontrol(*args: str) -> list[dict[str, str]]:
        out = subprocess.run(["scontrol", *args], check=True, capture_output=True, text=True)
        return [
            dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            for line in out.stdout.splitlines()
            if line.strip()
        ]

    job = scontrol("show", "job", "-o", job_id)[0]
    nodes = scontrol("show", "node", "-o", job["NodeList"])
    return int(job["NumNodes"].split("-")[0]), [node["NodeAddr"] for node in nodes]


def command(
    layout: Layout,
    worker: list[str],
    env: Mapping[str, str] = os.environ,
    cpus: int = 1,
    allocation: Callable[[str], tuple[int, list[str]]] = slurm_allocation,
    where: str = "train",
) -> list[str]:
    """The command that starts ``worker`` on every process of ``layout``, with ``cpus`` CPUs per
    node; ``where``: the config section of the layout, named in errors."""
    nproc = f"--nproc-per-node={layout.gpus_per_node}"
    # torchrun of this very environment
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    if layout.nodes == 1:
        # One node needs no srun, under SLURM or not: the job (or the executor's one-task step
        # around the rule) already holds the node's GPUs, and a nested srun would wait for the
        # step's own CPUs.
        return [*torchrun, "--standalone", "--nnodes=1", nproc, *worker]
    if "SLURM_JOB_ID" not in env:
        raise ValueError(
            f"{where}.distributed.nodes is {layout.nodes} but this is not a SLURM job: multi-node "
            "training runs under sbatch (snakemake --profile profiles/slurm)"
        )
    # two trainings in one allocation: two rendezvous
    job = f"{env['SLURM_JOB_ID']}-{os.getpid()}"
    nodes, hosts = allocation(env["SLURM_JOB_ID"])
    if nodes != layout.nodes:
        raise ValueError(
            f"{where}.distributed.nodes is {layout.nodes} but SLURM job {env['SLURM_JOB_ID']} "
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
    """SIGTERM torchrun (or srun) if this process dies, even by SIGKILL: torchrun then stops its
    workers, which run in sessions of their own and would otherwise train on and write the output
    unowned."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run(
    layout: Layout,
    target: Callable[..., dict[str, Any]],
    kwargs: Mapping[str, Any],
    *,
    threads: int,
    log: Callable[[str], Any],
    where: str,
) -> dict[str, Any]:
    """``target(**kwargs, threads=, log=)`` on every process of ``layout``: in this process when it
    is one, else in workers (each with its share of ``threads``; ``spawn``); rank 0's metrics.
    ``kwargs`` are JSON and include ``out_dir``."""
    if layout.world_size == 1:
        return target(**kwargs, threads=threads, log=log)
    per_process = max(1, threads // layout.gpus_per_node)
    return spawn(layout, target, {**kwargs, "threads": per_process}, log, cpus=threads, where=where)


def spawn(
    layout: Layout,
    target: Callable[..., dict[str, Any]],
    kwargs: Mapping[str, Any],
    log: Callable[[str], Any],
    cpus: int = 1,
    where: str = "train",
) -> dict[str, Any]:
    """Run ``target(**kwargs)`` (whose kwargs include ``out_dir``) on every process of ``layout``;
    return rank 0's metrics. The workers run ``target``'s module with ``python -m``: its
    ``__main__`` block must hand ``target`` to ``serve``.

    The spec and the metrics live beside the output, on the filesystem every node shares (a
    node-local /tmp would not reach the other nodes, nor necessarily the node of global rank 0)."""
    module = target.__module__
    out = Path(str(kwargs["out_dir"]).rstrip("/"))
    out.parent.mkdir(parents=True, exist_ok=True)
    # named like the output's own temporaries, so the next attempt removes it after a kill
    # (stillroom.io.stale_temporaries)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent) as tmp:
        spec, metrics = Path(tmp) / "spec.json", Path(tmp) / "metrics.json"
        spec.write_text(json.dumps({**kwargs, "metrics": str(metrics), "target": target.__name__}))
        # torchrun runs a module with -m
        cmd = command(layout, ["-m", module, str(spec)], cpus=cpus, where=where)
        log(f"launching {layout.world_size} processes: {shlex.join(cmd)}")
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
        if not metrics.exists():
            raise RuntimeError(
                f"workers wrote no metrics: {module} has no __main__ block that serves "
                f"{target.__name__} (launch.serve)"
            )
        return json.loads(metrics.read_text())


def serve(*targets: Callable[..., dict[str, Any]]) -> None:
    """The worker side of ``spawn``, called from the ``__main__`` block of the module that holds
    ``targets``: run the one the spec (the command line's one argument) names, with its kwargs;
    rank 0 writes the metrics."""
    from ..io import write_json

    spec = json.loads(Path(sys.argv[1]).read_text())
    metrics_path = spec.pop("metrics")
    name = spec.pop("target")
    by_name = {t.__name__: t for t in targets}
    if name not in by_name:
        raise ValueError(f"{sys.argv[0]} serves {', '.join(by_name)}, not {name}")
    prefix = f"[rank {rank()}] "
    metrics = by_name[name](
        **spec, log=lambda msg: print(prefix + msg, file=sys.stderr, flush=True)
    )
    if rank() == 0:
        write_json(metrics_path, metrics)
