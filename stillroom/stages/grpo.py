"""Rule grpo: GRPO on kernel problems (the AutoTriton recipe) from the fine-tune, with the kernel
track's one reward, execution x rules; in this process or on every process of ``grpo.distributed``.
The trainer, the reward and the diversity sampler are runtime/grpo.py's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..config import Experiment, Grpo, StageParams, ValidatorOptions
from ..runtime import launch
from .contract import stage

# The CLI imports every stage module to list the stages, and rule grpo builds its job's params with
# job_params: the trainer (TRL, the kernel validator) is imported where GRPO runs, not here.


class Params(StageParams, Grpo):
    validator: ValidatorOptions = ValidatorOptions()
    empty_unless_given = ("validator",)


def job_params(exp: Experiment) -> Params:
    """The params of the grpo job: the grpo section and the kernel validator's options."""
    given = {"validator": exp.kernels.validator} if exp.kernels else {}
    return Params(seed=exp.seed, **exp.grpo.model_dump(), **given)


@stage(
    "grpo",
    params=Params,
    inputs=("base", "problems"),
    outputs=("model",),
    help="GRPO on kernel problems with the dual (execution x rule) reward",
)
def run(
    *,
    base: str,
    problems: str,
    out_model: str,
    params: Mapping[str, Any] | Params,
    threads: int = 1,
    log: Callable[[str], Any] = print,
) -> dict[str, Any]:
    from ..runtime.grpo import train_grpo

    p = Params.parse(params, where="grpo")
    kwargs = {
        "base_dir": base,
        "problems": problems,
        "out_dir": out_model,
        # the grpo section alone: the seed and the validator's options travel beside it
        "params": p.model_dump(mode="json", by_alias=True, include=set(Grpo.model_fields)),
        "validator": p.validator.dump(),
        "seed": p.seed,
    }
    return launch.run(p.layout, train_grpo, kwargs, threads=threads, log=log, where="grpo")
