"""A teacher per effort (generation.effort_teachers): which efforts each generation job serves, the
rule the plan names for it, and the warning a config that mixes teachers gets when the workflow is
built."""

from __future__ import annotations

from stillroom.config import EffortGroup, Generation
from stillroom.plan.generation import generation_rules

BEAM = {
    "teacher": "beam-api",
    "efforts": ["medium", "low", "high", "xhigh"],
    "samples_per_prompt": 1,
    "shards": 62,
    "effort_shards": {"low": 20, "high": 20, "xhigh": 20},
}


def test_one_teacher_keeps_the_rules_it_had():
    gen = Generation.parse({**BEAM, "teacher": "beam-sglang", "effort_groups": [["low", "high"]]})
    assert not gen.mixed and gen.used_teachers == ["beam-sglang"]
    assert gen.effort_jobs() == [
        EffortGroup("beam-sglang", ("medium", "xhigh"), together=False),
        EffortGroup("beam-sglang", ("low", "high"), together=True),
    ]
    assert [r.name for r in generation_rules(gen)] == ["generate", "generate_low_high"]
    assert gen.mixing_warning("tables/teachers.md") is None


def test_each_teacher_generates_in_rules_of_its_own():
    gen = Generation.parse(
        {
            **BEAM,
            "effort_teachers": {
                "low": "beam-sglang",
                "high": "beam-sglang",
                "xhigh": "beam.sglang",
            },
            "effort_groups": [["low", "high"]],
        }
    )
    assert gen.used_teachers == ["beam-api", "beam-sglang", "beam.sglang"]
    assert [gen.teacher_of(e) for e in gen.efforts] == [
        "beam-api",
        "beam-sglang",
        "beam-sglang",
        "beam.sglang",
    ]
    jobs = [
        EffortGroup("beam-api", ("medium",), together=False),
        EffortGroup("beam.sglang", ("xhigh",), together=False),
        EffortGroup("beam-sglang", ("low", "high"), together=True),
    ]
    assert gen.effort_jobs() == jobs
    # a rule name is an identifier: the teacher's other characters become "_"
    rules = generation_rules(gen)
    assert [(r.name, r.group) for r in rules] == list(
        zip(["generate", "generate_beam_sglang", "generate_low_high"], jobs, strict=True)
    )


def test_the_warning_says_which_efforts_go_to_which_teacher_and_why_it_matters():
    gen = Generation.parse(
        {**BEAM, "effort_teachers": {"low": "beam-sglang", "high": "beam-sglang"}}
    )
    assert gen.mixed
    assert gen.mixing_warning("results/x/tables/teachers.md") == (
        "generation mixes teachers across efforts (medium, xhigh by beam-api; low, high by "
        "beam-sglang). A teacher's style and length go into every trace it writes (the "
        "distillation seed's self-hosted Beam wrote ~35% longer reasoning than its API at the same "
        "accuracy), so the student's effort levels would also learn a change of teacher, and the "
        "length spacing between efforts shifts. results/x/tables/teachers.md compares the "
        "teachers' trace lengths on the prompts they share; to avoid the shift, generate every "
        "effort with one teacher (generation.effort_teachers)."
    )


def test_naming_the_default_teacher_for_an_effort_mixes_nothing():
    gen = Generation.parse({**BEAM, "effort_teachers": {"low": "beam-api"}})
    assert not gen.mixed and [r.name for r in generation_rules(gen)] == ["generate"]
