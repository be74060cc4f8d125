"""Student-specific plug-ins: a weight function applied after every optimizer step and after every
merge, and a model option sampled afresh at every step.

nGPT-style students keep named matrices on the unit hypersphere: training steps and weight
interpolation both move rows off it, so the same hook runs in both places. A looped student samples
its loop count per step so that every setting keeps working. Hooks are named in config, never code:

    student:
      weight_hooks:
        - {fn: renorm_rows, match: ['self_attn\\.[qkvo]_proj\\.weight$'], dim: -1, norm: 1.0}
    train:
      sampled_options: {num_loops: [1, 2, 4]}

``match`` holds regular expressions searched in checkpoint tensor names (the parameter names of a
dense model); each must match something, or the run fails before training.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..config import WeightHook


def renorm_rows(tensor: torch.Tensor, *, dim: int, norm: float, eps: float) -> torch.Tensor:
    """``tensor`` with every vector along ``dim`` rescaled to L2 norm ``norm`` (computed in
    float32); the settings are a weight hook's (stillroom.config.WeightHook)."""
    t = tensor.float()
    scale = norm / torch.linalg.vector_norm(t, dim=dim, keepdim=True).clamp_min(eps)
    return (t * scale).to(tensor.dtype)


WEIGHT_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {"renorm_rows": renorm_rows}


class WeightHooks:
    """Configured weight functions, each applied to the tensors whose names match its patterns."""

    def __init__(self, specs: Iterable[WeightHook | Mapping[str, Any]] | None):
        self.hooks: list[tuple[Callable[..., torch.Tensor], list[re.Pattern], dict[str, Any]]] = []
        for i, spec in enumerate(specs or []):
            kwargs = WeightHook.parse(spec, where=f"weight_hooks.{i}").dump()
            name, patterns = kwargs.pop("fn"), kwargs.pop("match")
            self.hooks.append((WEIGHT_FUNCTIONS[name], [re.compile(p) for p in patterns], kwargs))

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def check_names(self, names: Iterable[str], where: str) -> None:
        """Every pattern must match at least one of ``names``."""
        names = list(names)
        for i, (_, patterns, _) in enumerate(self.hooks):
            for p in patterns:
                if not any(p.search(n) for n in names):
                    raise ValueError(
                        f"weight_hooks[{i}].match: {p.pattern!r} matches no tensor of {where} "
                        f"(e.g. {', '.join(names[:4])})"
                    )

    def matches(self, name: str) -> bool:
        """Whether some hook applies to the tensor ``name``."""
        return any(p.search(name) for _, patterns, _ in self.hooks for p in patterns)

    def apply(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        for fn, patterns, kwargs in self.hooks:
            if any(p.search(name) for p in patterns):
                tensor = fn(tensor, **kwargs)
        return tensor

    @torch.no_grad()
    def apply_to_model(self, model) -> None:
        for name, param in model.named_parameters():
            new = self.apply(name, param)
            if new is not param:
                param.copy_(new)


def sample_options(options: Mapping[str, list], seed: int, step: int) -> dict[str, Any]:
    """The option values for ``step``: a function of (seed, step) alone, so a resumed run repeats
    them."""
    rng = random.Random(f"{seed}:{step}")
    return {key: rng.choice(values) for key, values in sorted(options.items())}


def step_callback(
    hooks: WeightHooks, options: Mapping[str, list], seed: int, record: dict[str, dict]
):
    """A TrainerCallback: sample the options into ``model.config`` before each optimizer step, apply
    the weight hooks after it. ``record`` counts the sampled values."""
    from transformers import TrainerCallback

    class StepHooks(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            missing = [k for k in options if not hasattr(model.config, k)]
            if missing:
                raise ValueError(
                    f"train.sampled_options: the model config has no {', '.join(missing)}"
                )
            if hooks:
                hooks.check_names(
                    [n for n, _ in model.named_parameters()], "the model being trained"
                )
                # start on the constraint surface too
                hooks.apply_to_model(model)

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            for key, value in sample_options(options, seed, state.global_step).items():
                setattr(model.config, key, value)
                counts = record.setdefault(key, {})
                counts[str(value)] = counts.get(str(value), 0) + 1

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if hooks:
                hooks.apply_to_model(model)

    return StepHooks()
