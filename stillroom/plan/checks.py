"""The config checks that need the kernel track's problem sets or a model built by transformers
(on the meta device: names and attributes, no memory), over ``stillroom.config.resolve``'s: what
the workflow (rules/common.smk) and `stillroom estimate` / `check-config` run before any job.
(The config package imports neither the kernels nor the runtime.)"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import config as cfg
from ..config import ConfigError, Experiment
from ..config.data import KernelSource
from ..config.student_model import config_json, local_model
from ..io import DataError
from ..kernels import family, problemset
from .generation import gpu_key

# rules/*.smk's rules, by name
_RULE = re.compile(r"^\s*rule\s+(\w+)\s*:", re.MULTILINE)


def resolve(config: Mapping[str, Any], root: str | Path = ".") -> dict[str, Any]:
    """``stillroom.config.resolve``, and these checks."""
    exp = cfg.checked_experiment(config, root)
    _check(exp, Path(root))
    return exp.dump()


def workflow_experiment(
    config: Mapping[str, Any],
    configfiles: Iterable[str | Path],
    default: str | Path,
    root: str | Path,
    check: bool = True,
) -> Experiment:
    """``stillroom.config.workflow_experiment``, and these checks unless ``check`` is False (a
    cluster job parsing the workflow again: its main process checked them, a model built per job
    costs seconds). The workflow's one parse of its config."""
    exp = cfg.workflow_experiment(config, configfiles, default, root)
    if check:
        _check(exp, Path(root))
    return exp


def _check(exp: Experiment, root: Path) -> None:
    problems = rule_problems(exp, root)
    problems += kernel_problems(exp) + model_problems(exp, root)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def rule_problems(exp: Experiment, root: Path) -> list[str]:
    """cost.gpus and cost.gpu_type_by_rule name rules of the workflow (cost.gpus also a training
    phase's train-<phase>, another teacher's generate-<teacher>)."""
    cost = exp.cost
    named = [("gpus", r) for r in cost.gpus] + [
        ("gpu_type_by_rule", r) for r in cost.gpu_type_by_rule
    ]
    if not named:
        return []
    rules = {
        m for smk in sorted((root / "rules").glob("*.smk")) for m in _RULE.findall(smk.read_text())
    }
    rules |= {gpu_key(exp.generation, t) for t in exp.generation.used_teachers}
    rules |= {f"train-{ph.name}" for ph in exp.train.phases}
    problems = []
    for key, rule in named:
        if rule not in rules:
            close = difflib.get_close_matches(rule, rules, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"one of {', '.join(sorted(rules))}"
            problems.append(f"cost.{key}.{rule}: not a rule of the workflow ({hint})")
    return problems


def kernel_problems(exp: Experiment) -> list[str]:
    """Problem names a kernel source picks that it does not have (a JSONL source's rows are data,
    read by the pool job)."""
    problems = []
    for i, s in enumerate(exp.sources):
        if not isinstance(s, KernelSource) or not s.problems or s.path:
            continue
        if s.family:
            have = family.problem_names(s.family)
            missing = [p for p in s.problems if p not in have]
            if missing:
                problems.append(
                    f"sources.{i}.problems: {', '.join(missing)} not in family {s.family} "
                    f"(e.g. {', '.join(have[:3])})"
                )
            continue
        try:
            problemset.kernel_files(s)
        except DataError as exc:
            problems.append(f"sources.{i}.problems: {exc}")
    return problems


def model_problems(exp: Experiment, root: Path) -> list[str]:
    """LoRA targets the student lacks and sampled options it has no attribute for, checked on its
    transformers build as its training job checks them (runtime/adapters.py, runtime/hooks.py)."""
    train = exp.train
    if not (train.lora or train.sampled_options):
        return []
    found, what = config_json(exp, root)
    if found is None:  # a hub id (checked by its job) or a directory already refused
        return []
    if exp.student.model is not None:
        from ..runtime.student import shape_config

        assert exp.student.tokenizer  # a built student has both
        config = shape_config(exp.student.model, vocab_size=exp.student.tokenizer.vocab_size)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(local_model(exp.student.pretrained or "", root))
    problems = []
    missing = [k for k in train.sampled_options if not hasattr(config, k)]
    if missing:
        problems.append(
            f"train.sampled_options: the model config of {what} has no {', '.join(missing)}"
        )
    if train.lora:
        from ..runtime.adapters import resolve_targets

        try:
            resolve_targets(config, train.lora, name=what)
        except ValueError as exc:
            problems += str(exc).split("\n")
    return problems
