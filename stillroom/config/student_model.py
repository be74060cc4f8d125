"""Checks of the config against the student's own model config, before any job: its
``config.json`` where ``student.pretrained`` is a local directory, or the config of the
``student.model`` built here. A hub id is not read (no network while the DAG is built): its job
checks the same at its start (runtime/adapters.py ``resolve_targets``, runtime/hooks.py for
``sampled_options``, the training stage's expert-parallel setup)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .data import HUB_ID

if TYPE_CHECKING:
    from .experiment import Experiment

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


def _config_json(exp: Experiment, root: Path) -> tuple[dict[str, Any] | None, str]:
    """The student's config.json as a dict, and what it is (None: a hub id, or not loadable)."""
    student = exp.student
    if student.model is not None:
        return _shape_config(exp).to_dict(), "student.model"
    path = local_model(student.pretrained or "", root)
    if path is None or model_dir_problem("student.pretrained", student.pretrained or "", root):
        return None, ""
    return json.loads((path / "config.json").read_text()), f"student.pretrained {path}"


def _shape_config(exp: Experiment) -> Any:
    from ..runtime.student import shape_config

    assert exp.student.model and exp.student.tokenizer  # a built student has both
    return shape_config(exp.student.model, vocab_size=exp.student.tokenizer.vocab_size)


def _transformers_config(exp: Experiment, root: Path) -> Any:
    """The student's transformers config (class defaults filled in), for attributes and modules."""
    if exp.student.model is not None:
        return _shape_config(exp)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(local_model(exp.student.pretrained or "", root))


def problems(exp: Experiment, root: Path) -> list[str]:
    """What the student's model config refuses: LoRA targets it lacks, experts split unevenly,
    sampled attributes it does not have, a GRPO completion longer than its context."""
    train = exp.train
    needs_config = train.lora or train.sampled_options or exp.grpo or train.expert_parallel
    if not needs_config:
        return []
    config, what = _config_json(exp, root)
    if config is None:
        return []
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
    if exp.grpo and context and exp.grpo.max_completion_length >= context:
        out.append(
            f"grpo.max_completion_length: {exp.grpo.max_completion_length} leaves no room for "
            f"the prompt in the max_position_embeddings ({context}) of {what}"
        )
    if (lora and not out) or train.sampled_options:
        out += _transformers_problems(exp, root, what)
    return out


def _transformers_problems(exp: Experiment, root: Path, what: str) -> list[str]:
    """Checks on the model as transformers builds it (on the meta device: no memory)."""
    config = _transformers_config(exp, root)
    out = []
    missing = [k for k in exp.train.sampled_options if not hasattr(config, k)]
    if missing:
        out.append(f"train.sampled_options: the model config of {what} has no {', '.join(missing)}")
    if exp.train.lora:
        from ..runtime.adapters import resolve_targets

        try:
            resolve_targets(config, exp.train.lora, name=what)
        except ValueError as exc:
            out += str(exc).split("\n")
    return out
