"""The srun/torchrun command of a layout, and FSDP2 on 2 CPU ranks against 1 rank."""

import contextlib
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stillroom.config import ConfigError, Train
from stillroom.runtime.launch import command, job_port, load_kwargs
from stillroom.stages.train import Params
from stillroom.stages.train import run as train_stage

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@pytest.mark.parametrize(
    "memory, max_memory",
    [
        ({"gpu_memory_limit": 125}, {0: 125 * 2**30, 1: 125 * 2**30}),
        ({"gpu_memory_limit": "80GB"}, {0: 80 * 10**9, 1: 80 * 10**9}),
        ({"max_memory": {0: 70, "cpu": "1TiB"}}, {0: 70 * 2**30, "cpu": 2**40}),
    ],
)
def test_the_device_maps_memory_limit_reaches_transformers_in_bytes(
    memory, max_memory, monkeypatch
):
    """gpu_memory_limit: 125 is 125 GiB of each GPU (Axolotl's reading), not the 125 bytes that
    transformers' max_memory makes of an int."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    params = Train.parse({"device_map": "auto", "distributed": {"gpus_per_node": 2}, **memory})
    assert load_kwargs(params) == {"device_map": "auto", "max_memory": max_memory}


def test_command_outside_slurm_is_standalone_torchrun():
    layout = Train.parse({"distributed": {"gpus_per_node": 2}}).layout
    assert command(layout, ["w"], env={}) == [
        *TORCHRUN,
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
        "w",
    ]
    with pytest.raises(ValueError, match="not a SLURM job"):
        command(Train.parse({"distributed": {"nodes": 2}}).layout, ["w"], env={})
    # One node inside a SLURM job is the same: the executor's one-task step already holds the GPUs.
    assert command(layout, ["w"], env={"SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}) == command(
        layout, ["w"], env={}
    )


def test_command_under_slurm_is_one_srun_task_per_node_with_a_per_job_rendezvous():
    layout = Train.parse({"distributed": {"nodes": 2, "gpus_per_node": 8}}).layout
    env = {
        "SLURM_JOB_ID": "123456"
    }  # all the executor's job step keeps of the allocation's variables
    seen = []
    cmd = command(
        layout,
        ["w"],
        env=env,
        cpus=64,
        allocation=lambda job: seen.append(job) or (2, ["gpu07", "gpu08"]),
    )
    assert seen == ["123456"]
    job = f"123456-{os.getpid()}"
    assert cmd == [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=64",
        "--kill-on-bad-exit=1",
        *TORCHRUN,
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=gpu07:{job_port(job)}",
        f"--rdzv-id={job}",
        "w",
    ]
    assert job_port(job) != job_port("123457-1") and 20000 <= job_port(job) < 50000
    with pytest.raises(ValueError, match="has 3 node"):
        command(layout, ["w"], env=env, allocation=lambda _: (3, ["a", "b", "c"]))


@pytest.mark.slow
def test_fsdp2_on_two_cpu_ranks_matches_one_rank_on_the_same_global_batch(setup, tmp_path):
    """Two gloo ranks with batch 4 each against one process with batch 8: same losses, same
    weights."""
    common = {"lr": 3e-3, "max_steps": 6, "max_length": 128, "logging_steps": 1, "seed": 0}
    one = train_stage(
        base=str(setup / "base"),
        dataset=str(setup / "train.jsonl"),
        out_model=str(tmp_path / "one"),
        params={**common, "batch_size": 8},
        threads=2,
        log=lambda _: None,
    )
    logs = []
    two = train_stage(
        base=str(setup / "base"),
        dataset=str(setup / "train.jsonl"),
        out_model=str(tmp_path / "two"),
        params={**common, "batch_size": 4, "distributed": {"gpus_per_node": 2}},
        threads=2,
        log=logs.append,
    )
    assert any("--nproc-per-node=2" in line for line in logs)
    assert two["world_size"] == 2 and one["world_size"] == 1 and two["steps"] == one["steps"] == 6
    # Tolerance: the two ranks reduce their gradients in another order than one process sums them.
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-3)
    a, b = (
        load_file(tmp_path / "one" / "model.safetensors"),
        load_file(tmp_path / "two" / "model.safetensors"),
    )
    assert set(a) == set(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4)
    assert (tmp_path / "two" / "tokenizer.json").exists() and not list(tmp_path.glob(".two.*"))


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def kill_and_resume(
    base: Path, dataset: Path, params: dict, tmp_path: Path, kill_at: int | None = None
):
    """Train with ``params`` straight through; then again, SIGKILLing the whole job once its
    checkpoint of step ``kill_at`` (None: of any step, e.g. one saved by time) is complete, and
    once more, which must resume from it. Returns the two outputs (straight, resumed)."""
    import json
    import signal
    import subprocess
    import time

    def cmd(out):
        return [
            sys.executable,
            "-m",
            "stillroom",
            "train",
            "--base",
            str(base),
            "--dataset",
            str(dataset),
            "--out-model",
            str(out),
            "--params",
            json.dumps(params),
            "--threads",
            "2",
        ]

    straight = subprocess.run(cmd(tmp_path / "straight"), capture_output=True, text=True)
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = tmp_path / "killed"
    step = "*" if kill_at is None else kill_at
    marker = f"killed.checkpoints/checkpoint-{step}/trainer_state.json"
    proc = subprocess.Popen(cmd(out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not any(tmp_path.glob(marker)) and time.monotonic() < deadline:
        time.sleep(0.02)
    # Preemption kills every process of the job at once (SLURM's cgroup): the launcher, torchrun
    # and both ranks, which torchrun starts in sessions of their own.
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert any(tmp_path.glob(marker)) and not out.exists()
    resumed = subprocess.run(cmd(out), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr, resumed.stderr[-4000:]
    assert not (tmp_path / "killed.checkpoints").exists()
    return tmp_path / "straight", out


@pytest.mark.slow
def test_killed_sharded_training_resumes_to_the_same_weights(setup, tmp_path):
    """SIGKILL the whole 2-rank job after a sharded checkpoint; the rerun restores model, Adam
    moments and lr schedule from it and ends where an uninterrupted run ends."""
    params = {
        "lr": 3e-3,
        "max_steps": 14,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 2,
        "seed": 0,
        "save_steps": 3,
        "distributed": {"gpus_per_node": 2},
    }
    straight, out = kill_and_resume(
        setup / "base", setup / "train.jsonl", params, tmp_path, kill_at=6
    )
    a, b = load_file(straight / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(a) == set(b) and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


@pytest.mark.slow
def test_every_rank_checkpoints_by_time_when_rank_0_says_so(tmp_path):
    """A time-based checkpoint is a collective: each rank gets rank 0's answer, whatever its own
    clock reads (one rank past the interval and the other not would hang FSDP's save)."""
    from stillroom.runtime.launch import spawn
    from tests.runtime.clock_probe import probe

    out = spawn(
        Train.parse({"distributed": {"gpus_per_node": 2}}).layout,
        probe,
        {"out_dir": str(tmp_path / "probe"), "threads": 1},
        log=lambda _: None,
        cpus=2,
    )
    assert out["answers"] == [[False, True], [False, True]]


@pytest.mark.slow
def test_killed_sharded_training_resumes_from_a_time_based_checkpoint(setup, tmp_path):
    """save_minutes alone (no save_steps) on 2 FSDP2 ranks: both write their shards of the same
    step (a checkpoint is complete only once every rank's are in), and a job SIGKILLed after one
    resumes from it to the weights of an uninterrupted run."""
    params = {
        "lr": 3e-3,
        "max_steps": 14,
        "batch_size": 2,
        "max_length": 128,
        "logging_steps": 2,
        "seed": 0,
        "save_minutes": 0.001,  # 60 ms: about every step
        "distributed": {"gpus_per_node": 2},
    }
    straight, out = kill_and_resume(setup / "base", setup / "train.jsonl", params, tmp_path)
    a, b = load_file(straight / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(a) == set(b) and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5


@pytest.mark.slow
def test_qlora_processes_are_data_parallel_replicas(setup, tmp_path):
    """4-bit weights cannot be FSDP-sharded: two QLoRA ranks each hold the whole NF4 model (DDP) and
    match one process on the same global batch."""
    common = {
        "method": "qlora",
        "load_in_4bit": True,
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "lr": 5e-3,
        "max_steps": 4,
        "max_length": 128,
        "logging_steps": 1,
        "seed": 0,
    }
    runs = {}
    for name, extra in (
        ("one", {"batch_size": 4}),
        ("two", {"batch_size": 2, "distributed": {"gpus_per_node": 2}}),
    ):
        runs[name] = train_stage(
            base=str(setup / "base"),
            dataset=str(setup / "train.jsonl"),
            out_model=str(tmp_path / name),
            params={**common, **extra},
            threads=2,
            log=lambda _: None,
        )
    assert runs["two"]["world_size"] == 2
    assert runs["two"]["losses"] == pytest.approx(runs["one"]["losses"], rel=1e-3)
    with pytest.raises(ConfigError, match="train.distributed: .* do not survive FSDP2 sharding"):
        Params.parse({**common, "distributed": {"gpus_per_node": 2, "fsdp_size": 2}}, where="train")


@pytest.mark.slow
def test_lora_on_two_fsdp_ranks_saves_the_whole_adapter(setup, tmp_path):
    """Only the adapter is gathered from the shards for the save; it matches one process's
    training."""
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    common = {
        "method": "lora",
        "lora": lora,
        "lr": 5e-3,
        "max_steps": 4,
        "max_length": 128,
        "logging_steps": 1,
        "seed": 0,
    }
    one = train_stage(
        base=str(setup / "base"),
        dataset=str(setup / "train.jsonl"),
        out_model=str(tmp_path / "one"),
        params={**common, "batch_size": 4},
        threads=2,
        log=lambda _: None,
    )
    two = train_stage(
        base=str(setup / "base"),
        dataset=str(setup / "train.jsonl"),
        out_model=str(tmp_path / "two"),
        params={**common, "batch_size": 2, "distributed": {"gpus_per_node": 2}},
        threads=2,
        log=lambda _: None,
    )
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-3)
    a = load_file(tmp_path / "one" / "adapter_model.safetensors")
    b = load_file(tmp_path / "two" / "adapter_model.safetensors")
    assert set(a) == set(b) and all(a[k].shape == b[k].shape for k in a)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-3, atol=1e-4)


# One AdamW step of torchao's low-bit optimizer on a model FSDP2-sharded over 2 gloo ranks.
LOW_BIT_STEP = """
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchao.optim import AdamW4bit, AdamW8bit

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128))
mesh = init_device_mesh("cpu", (2,))
for layer in model[::2]:
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optim = {"4bit": AdamW4bit, "8bit": AdamW8bit}[sys.argv[1]]
step = optim(model.parameters(), lr=1e-2, block_size=128)
model(torch.randn(16, 128)).pow(2).mean().backward()
step.step()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchaos_low_bit_adamw_fails_sharded_once_the_other_one_ran(tmp_path):
    """The measurement behind refusing adamw_torch_4bit / adamw_torch_8bit with FSDP2
    (config/training.py ONE_DEVICE_OPTIMIZERS): each steps FSDP2 shards in a fresh inductor cache,
    but the 4-bit one fails once the 8-bit one ran sharded with the same cache (a node's
    /tmp/torchinductor_$USER). When this stops failing, the refusal can go."""
    import subprocess

    (tmp_path / "step.py").write_text(LOW_BIT_STEP)

    def step(bits: str, cache: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / cache)}
        cmd = [*TORCHRUN, "--standalone", "--nproc-per-node=2", str(tmp_path / "step.py"), bits]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)

    fresh = step("4bit", "fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    first = step("8bit", "shared")
    assert first.returncode == 0, first.stderr[-3000:]
    second = step("4bit", "shared")
    assert second.returncode and "wrong number of dimensions" in second.stderr, second.stderr[
        -3000:
    ]
