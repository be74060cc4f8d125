"""A teacher per effort (generation.effort_teachers): which efforts each generation job serves (its
effort key), the key its GPUs are charged under, and the warning a config that mixes teachers gets
when the workflow is built."""

from __future__ import annotations

import pytest

from stillroom.config import ConfigError, Generation
from stillroom.plan.generation import JOIN, effort_key, effort_keys, gpu_key

BEAM = {
    "teacher": "beam-api",
    "efforts": ["medium", "low", "high", "xhigh"],
    "samples_per_prompt": 1,
    "shards": 62,
    "effort_shards": {"low": 20, "high": 20, "xhigh": 20},
}


def test_an_effort_alone_is_its_own_key_and_a_group_one_key_for_all():
    gen = Generation.parse({**BEAM, "teacher": "beam-sglang", "effort_groups": [["low", "high"]]})
    assert not gen.mixed and gen.used_teachers == ["beam-sglang"]
    # medium and xhigh keep the file they had alone (gen/<teacher>/<effort>/...)
    assert effort_keys(gen) == {
        "medium": ["medium"],
        "xhigh": ["xhigh"],
        "low+high": ["low", "high"],
    }
    assert effort_key(gen, "high") == "low+high" and effort_key(gen, "xhigh") == "xhigh"
    assert gpu_key(gen, "beam-sglang") == "generate"
    assert gen.mixing_warning("tables/teachers.md") is None


def test_effort_keys_cannot_collide():
    """Rule names joined efforts with "_", which efforts may hold: [a, b_c] and [a_b, c] both made
    generate_a_b_c. "+" is in no effort's name, so two groups never share a key."""
    gen = Generation.parse(
        {
            **BEAM,
            "efforts": ["a", "b_c", "a_b", "c"],
            "effort_shards": {},
            "effort_groups": [["a", "b_c"], ["a_b", "c"]],
        }
    )
    assert list(effort_keys(gen)) == ["a+b_c", "a_b+c"]
    with pytest.raises(ConfigError, match=r"efforts\.0"):
        Generation.parse({**BEAM, "efforts": [f"low{JOIN}high"], "effort_shards": {}})


def test_each_teacher_s_jobs_are_charged_under_a_key_of_their_own():
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
    assert effort_keys(gen) == {
        "medium": ["medium"],
        "xhigh": ["xhigh"],
        "low+high": ["low", "high"],
    }
    # one rule, generate; another teacher's server shape is charged as generate-<teacher>
    assert [gpu_key(gen, t) for t in gen.used_teachers] == [
        "generate",
        "generate-beam-sglang",
        "generate-beam.sglang",
    ]


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
    assert not gen.mixed and [gpu_key(gen, t) for t in gen.used_teachers] == ["generate"]
