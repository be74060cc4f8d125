"""The shape of each GPU stage's job, as the science config fixes it: GPUs per teacher server, nodes
and GPUs per node of the training layout (of each training phase), GPUs of the evaluation backend.

These counts are not tuning knobs: an FSDP layout over 2 nodes x 8 GPUs needs exactly that
allocation, and an SGLang server with ``--tp 2`` needs 2 GPUs. So the rules derive them here from
the config, and the profile (profiles/slurm) adds everything else: partitions, memory, runtime,
CPUs, retries.

Single-node jobs ask for ``gpu`` (sbatch ``--gpus``, none when 0; the executor gives its one-task
step the same count). A multi-node training job asks for ``gres: gpu:<per node>`` on ``nodes`` nodes
with one task per node, and ``mpi`` so the executor runs the rule in the batch script itself, where
the launcher's ``srun`` (one ``torchrun`` per node) can use the whole allocation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..config import Generation, Grpo, Server, Train
from .generation import gpu_key


def server_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs an SGLang server started in the job uses: ``server.gpus``, else tensor x data
    parallel."""
    return Server.parse(spec["server"], where="server").gpu_count


def backend_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs of a model backend run inside the job: a started server, an in-process model (one GPU),
    or none for an API or the procedural stand-in."""
    backend = spec["backend"]
    if backend == "sglang":
        return server_gpus(spec)
    return 1 if backend == "hf" else 0


def train_resources(
    config: Mapping[str, Any], section: str = "train", phase: int | None = None
) -> dict[str, Any]:
    """The job of ``section``'s layout (``train`` or ``grpo``; of train.phases[``phase``] when
    given, which may have its own). One node: ``gpus_per_node`` GPUs (one process per GPU, or one
    device_map process over them all). Several: ``gres`` per node, one launcher task per node,
    launcher in the batch script (``mpi``)."""
    layout = _layout(config, section, phase)
    if layout.nodes == 1:
        return {"gpu": layout.gpus_per_node, "nodes": 1}
    return {
        "nodes": layout.nodes,
        "tasks": layout.nodes,
        "gres": f"gpu:{layout.gpus_per_node}",
        "mpi": "srun",
    }


def _layout(config: Mapping[str, Any], section: str, phase: int | None = None):
    if section == "grpo":
        return Grpo.parse(config[section], where=section).layout
    train = Train.parse(config[section], where=section)
    return train.phase_layout(None if phase is None else train.phases[phase])


def stage_gpus(config: Mapping[str, Any]) -> dict[str, int]:
    """GPUs per job of each GPU rule: what the cost ledger charges when SLURM accounting has no
    answer."""
    layout = _layout(config, "train")
    evaluation = backend_gpus(config["eval"]["backend"])
    # a teacher's generation jobs have its server's GPUs (generation.effort_teachers): charged as
    # generate, or generate-<teacher> for another teacher than generation.teacher
    generation = Generation.parse(config["generation"], where="generation")
    # a training phase with a layout of its own is charged as train-<phase name>
    phases = [
        (ph["name"], _layout(config, "train", i))
        for i, ph in enumerate(config["train"].get("phases") or [])
        if ph.get("distributed")
    ]
    gpus = {
        **{
            gpu_key(generation, t): backend_gpus(config["teachers"][t])
            for t in generation.used_teachers
        },
        "train": layout.nodes * layout.gpus_per_node,
        **{f"train-{name}": ly.nodes * ly.gpus_per_node for name, ly in phases},
        "evaluate": evaluation,
        "evaluate_budget": evaluation,
        "evaluate_effort": evaluation,
    }
    if config.get("grpo"):
        grpo = _layout(config, "grpo")
        gpus["grpo"] = grpo.nodes * grpo.gpus_per_node
    # compiled kernels need a GPU
    if (config.get("kernels") or {}).get("device") == "cuda":
        gpus.update(grade_generation=1, grade_eval=1)
    return gpus


# Host memory per node (MB) of the jobs that hold the student, as sized for the recipes' 4B
# student (Qwen3-4B): training's FSDP state, data and checkpoints take most of a B200 node; a merge
# holds two checkpoints; an evaluation a server and its samples. A smaller student asks its share
# of these, at least STUDENT_MIN_MEM_MB (a torch process and its data); an unknown size, all.
STUDENT_FULL_MEM_MB = {
    "train": 1_000_000,
    "merge": 256_000,
    "evaluate": 128_000,
    "evaluate_budget": 128_000,
    "evaluate_effort": 128_000,
    "serve_model": 128_000,
}
STUDENT_FULL_PARAMS = 4e9
STUDENT_MIN_MEM_MB = 8000
# A client of a server its allocation shares (an evaluation or generation job): its tokenizer, the
# requests in flight and its samples; the model's memory is its server's.
CLIENT_MEM_MB = 4000


def student_mem_mb(rule: str, params: float | None, attempt: int) -> int:
    """``rule``'s memory per node (MB) for a student of ``params`` parameters, on ``attempt``: a
    retry asks that many times more; training's never more than its full size (a retry resumes
    from its checkpoints, and the full size is most of a node)."""
    full = STUDENT_FULL_MEM_MB[rule]
    share = full if params is None else math.ceil(full * min(1.0, params / STUDENT_FULL_PARAMS))
    mem = max(STUDENT_MIN_MEM_MB, share) * attempt
    return min(full, mem) if rule == "train" else mem
