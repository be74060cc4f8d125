"""The workflow's generation rules, named from the config's effort groups: the config says which
efforts a job serves (``Generation.effort_jobs``), the plan names the rules that run them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..config import EffortGroup, Generation

RULE = "generate"


@dataclass(frozen=True)
class GenerationRule:
    """A rule of rules/generate.smk. Snakemake fixes a rule's output files, so an effort group
    (several outputs a job) has a rule of its own, ``generate_<efforts>``; the efforts generated one
    a job are ``generate`` for generation.teacher, ``generate_<teacher>`` for another teacher (its
    jobs have its server's shape)."""

    name: str
    group: EffortGroup

    @property
    def teacher(self) -> str:
        return self.group.teacher

    @property
    def efforts(self) -> tuple[str, ...]:
        return self.group.efforts

    def job_efforts(self, effort: str | None) -> str | list[str]:
        """A job's efforts: its group's (a list, one job for all), else its {effort} wildcard's."""
        return list(self.efforts) if self.group.together else effort


def rule_name(generation: Generation, group: EffortGroup) -> str:
    if group.together:
        return f"{RULE}_{'_'.join(group.efforts)}"
    if group.teacher == generation.teacher:
        return RULE
    return f"{RULE}_{re.sub(r'[^A-Za-z0-9_]', '_', group.teacher)}"


def generation_rules(generation: Generation) -> list[GenerationRule]:
    return [GenerationRule(rule_name(generation, g), g) for g in generation.effort_jobs()]


def name_problems(generation: Generation) -> list[str]:
    """A teacher's rule is named after it: it may take a group's or another teacher's name."""
    problems = []
    names: dict[str, str] = {}
    for rule in sorted(generation_rules(generation), key=lambda r: not r.group.together):
        owner = (
            f"effort group {list(rule.efforts)}"
            if rule.group.together
            else f"teacher '{rule.teacher}'"
        )
        if rule.name in names:
            problems.append(
                f"generation.effort_teachers: the rule {rule.name} of teacher '{rule.teacher}' "
                f"has the name of the rule of {names[rule.name]}: rename the teacher"
            )
        names[rule.name] = owner
    return problems
