"""Rule train: SFT of the student on the teacher's traces (full, LoRA or QLoRA): the stage parses
its params and launches the training body (runtime/sft.py ``train_sft``) in this process or on every
process of ``train.distributed``. LoRA / QLoRA save the adapter; rule merge_adapter merges it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field, model_validator

from ..config import Experiment, StageParams, Student, Train, WeightHook
from ..config.training import EffortTagIn, TrainPhase, hooks_problem
from ..runtime import launch
from ..runtime.sft import train_sft
from .contract import stage


class Params(StageParams, Train):
    weight_hooks: list[WeightHook] = []
    phase: TrainPhase | None = Field(
        None, exclude_if=lambda v: v is None, description="this job's phase of train.phases"
    )
    effort_tag_in: EffortTagIn = Student.model_fields["effort_tag_in"].default
    # Not the job's params: the template is its input file (--chat-template), and the phase list is
    # the plan's (this job's own is ``phase``, so a later phase's change never reruns it).
    chat_template: None = Field(None, exclude=True)
    phases: list[TrainPhase] = Field([], exclude=True)

    @model_validator(mode="after")
    def _hooks(self) -> Params:
        problem = hooks_problem(self.method, self.weight_hooks)
        if problem:
            raise ValueError(f"weight_hooks: {problem}")
        return self


def job_params(exp: Experiment, phase: str = "") -> Params:
    """The params of a training job: the train section, the student's settings training reads, and
    the job's phase of train.phases by name, with its epochs and processes ("": none, the section's
    own; the ablation's jobs and an experiment without phases)."""
    own: dict[str, Any] = {}
    if phase:
        # in place of the phase list: the phase, its epochs and its processes
        ph = next(p for p in exp.train.phases if p.name == phase)
        own = {"phases": [], "phase": ph, "epochs": ph.epochs}
        if ph.distributed:
            own["distributed"] = ph.distributed
    train = exp.train.model_dump(exclude={"chat_template"})
    return Params(
        seed=exp.seed,
        **{**train, **own},
        weight_hooks=exp.student.weight_hooks,
        effort_tag_in=exp.student.effort_tag_in,
    )


@stage(
    "train",
    params=Params,
    inputs=("base", "dataset", "chat_template?"),
    outputs=("model",),
    help="supervised fine-tuning",
)
def run(
    *,
    base: str,
    dataset: str,
    out_model: str,
    params: Mapping[str, Any] | Params,
    chat_template: str | None = None,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    p = Params.parse(params, where="train")
    kwargs = {
        "base_dir": base,
        "dataset_path": dataset,
        "out_dir": out_model,
        "chat_template": chat_template,
        # the train section alone: the seed, the student's settings and the phase travel beside it
        "params": p.model_dump(mode="json", by_alias=True, include=set(Train.model_fields)),
        **p.model_dump(mode="json", by_alias=True, exclude=set(Train.model_fields)),
    }
    return launch.run(p.layout, train_sft, kwargs, threads=threads, log=log, where="train")
