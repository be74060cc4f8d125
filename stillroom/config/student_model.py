"""Checks of the config against the student's own model config, before any job: its
``config.json`` where ``student.pretrained`` is a local directory, or the ``student.model`` built
here (what transformers must build to check, LoRA's targets and sampled options, is in
plan/checks.py). A hub id is not read (no network while the DAG is built): its training job
checks LoRA's targets and sampled options once it has the model (runtime/adapters.py
``resolve_targets``, runtime/hooks.py); its expert count meets expert_parallel_size only in
transformers' expert-parallel setup, in that job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .data import HUB_ID

# what transformers needs of a model directory: the model's config and its tokenizer's
MODEL_FILES = ("config.json", "tokenizer_config.json")
# the expert count's name in the config.json of each MoE family (Qwen-MoE, Mixtral, DeepSeek)
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def local_model(name: str, root: Path) -> Path | None:
    """The directory a model name means, if it is local: absolute, present under ``root``, or not
    shaped like a hub id (owner/name); None for a hub id, fetched by its job."""
    path = Path(name)
    full = path if path.is_absolute() else root / path
    if path.is_absolute() or full.exists() or not HUB_ID.fullmatch(name):
        return full
    return None


def model_dir_problem(key: str, name: str, root: Path) -> str | None:
    """Why the local model ``name`` cannot be loaded (None: a hub id, or a model directory)."""
    path = local_model(name, root)
    if path is None:
        return None
    if not path.is_dir():
        state = "is not a directory" if path.exists() else "does not exist"
        return f"{key}: {name} {state} (a local model directory, or a hub id owner/name)"
    missing = [f for f in MODEL_FILES if not (path / f).is_file()]
    if missing:
        return f"{key}: {name} is not a model directory (no {', '.join(missing)})"
    return None


def config_json(exp: Any, root: Path) -> tuple[dict[str, Any] | None, str]:
    """The student's config.json as a dict, and what it is (None: a hub id, or not loadable).
    ``exp``: an Experiment (which imports this module)."""
    student = exp.student
    if student.model is not None:  # its keys are config.json's
        return student.model.dump(), "student.model"
    path = local_model(student.pretrained or "", root)
    if path is None or model_dir_problem("student.pretrained", student.pretrained or "", root):
        return None, ""
    return json.loads((path / "config.json").read_text()), f"student.pretrained {path}"


def problems(exp: Any, root: Path) -> list[str]:
    """What the student's model config refuses: expert parameters of a dense model, experts split
    unevenly, a GRPO completion longer than its context."""
    train = exp.train
    if not (train.lora or exp.grpo or train.expert_parallel):
        return []
    config, what = config_json(exp, root)
    if config is None:
        return []
    student_local = exp.student.model is None
    out = []
    experts = next((config[k] for k in EXPERT_KEYS if config.get(k)), None)
    lora = train.lora
    if lora and lora.target_parameters and not experts:
        out.append(
            f"train.lora.target_parameters: {what} is a dense model (no experts in its config"
            "): there are no fused expert parameters to adapt"
        )
    for key, ep in train.expert_parallel.items():
        if not experts:
            out.append(f"{key}.expert_parallel_size: {ep}, but {what} is a dense model")
        elif experts % ep:
            out.append(
                f"{key}.expert_parallel_size: {ep} does not divide the {experts} experts of {what}"
            )
    context = config.get("max_position_embeddings")
    # (a built student's is checked with its shape, in Experiment)
    if exp.grpo and student_local and context and exp.grpo.max_completion_length >= context:
        out.append(
            f"grpo.max_completion_length: {exp.grpo.max_completion_length} leaves no room for "
            f"the prompt in the max_position_embeddings ({context}) of {what}"
        )
    return out
