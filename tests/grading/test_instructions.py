"""IFEval-style instruction checkers, strict and loose scoring, gold validation and the shipped
benchmark."""

from __future__ import annotations

import json

import pytest

from stillroom.grading.instructions import (
    INSTRUCTIONS,
    InstructionError,
    grade_instructions,
    loose_variants,
    parse_instructions,
)
from stillroom.io import read_jsonl

from ..conftest import REPO

CASES = [  # (id, kwargs, a response that follows it, one that does not)
    ("length_words_max", {"n": 5}, "One two three four five.", "One two three four five six."),
    ("length_words_min", {"n": 3}, "It's well-known here.", "Too short."),
    ("length_sentences_max", {"n": 2}, "One. Two!", "One. Two? Three."),
    ("length_sentences_min", {"n": 3}, "One. Two? Three!", "Only one sentence here."),
    (
        "keywords_include",
        {"keywords": ["cat", "red hat"]},
        "The Cat wore a RED HAT.",
        "The concatenated hat.",
    ),
    (
        "keywords_forbidden",
        {"words": ["cheap"]},
        "Affordable and cheaply made? No: durable.",
        "It is Cheap!",
    ),
    ("format_json", {}, '```json\n{"a": [1, 2]}\n```', 'Here: {"a": 1}'),
    ("format_json", {}, " [1, 2, 3] ", '{"a": 1,}'),
    ("case_lowercase", {}, "all quiet, 42 times.", "all quiet, Mostly."),
    ("case_uppercase", {}, "LOUD NOISES! 100%", "LOUD noises"),
    ("bullets_exact", {"n": 2}, "Intro\n* one\n- two\n**bold** line", "* one\n* two\n* three"),
    ("paragraphs_exact", {"n": 3}, "First.\n\nSecond.\n***\nThird.", "First.\n\nSecond."),
    (
        "paragraphs_exact",
        {"n": 2},
        "\n\nA line\nsame para.\n\n   \n\nB.\n\n",
        "A.\n***\nB.\n***\nC.",
    ),
    ("starts_with", {"phrase": "Imagine"}, "  imagine a box.", "So, imagine a box."),
    (
        "ends_with",
        {"phrase": "Any other questions?"},
        "Done. Any other questions?  \n",
        "Any other questions? Bye.",
    ),
    ("title", {}, "Text\n<<My Title>>\nmore", "Text <<>> and <<\n>> only"),
    ("title", {"at_start": True}, "  <<Autumn>>\nleaves fall", "A poem\n<<Autumn>>"),
    ("no_commas", {}, "No commas here; none at all.", "One, two."),
]


@pytest.mark.parametrize(("id_", "kwargs", "good", "bad"), CASES)
def test_checker_accepts_and_rejects(id_, kwargs, good, bad):
    check = INSTRUCTIONS[id_].check
    assert check(good, **kwargs) is True
    assert check(bad, **kwargs) is False


def test_every_required_instruction_is_registered():
    required = {
        "length_words_max",
        "length_words_min",
        "length_sentences_max",
        "length_sentences_min",
        "keywords_include",
        "keywords_forbidden",
        "format_json",
        "case_lowercase",
        "case_uppercase",
        "bullets_exact",
        "paragraphs_exact",
        "ends_with",
        "title",
        "no_commas",
    }
    assert required <= set(INSTRUCTIONS)
    assert required <= {c[0] for c in CASES}


def test_preamble_line_fails_strict_but_passes_loose():
    response = (
        'Sure! Here is the JSON you asked for:\n```json\n{"title": "Dune", "year": 1965}\n```'
    )
    r = grade_instructions(response, '[{"id": "format_json"}]')
    assert r.strict == (False,) and r.loose == (True,)
    assert not r.prompt_strict and r.prompt_loose
    assert r.grade_fields() == {"correct": False, "extracted": None, "status": "ok"}


def test_markdown_asterisks_fail_strict_but_pass_loose():
    gold = json.dumps(
        [
            {"id": "starts_with", "kwargs": {"phrase": "Imagine"}},
            {"id": "length_words_max", "kwargs": {"n": 10}},
        ]
    )
    r = grade_instructions("**Imagine** a loop that calls itself.", gold)
    assert r.strict == (False, True) and r.loose == (True, True)
    assert r.instruction_strict == 0.5 and r.instruction_loose == 1.0
    assert r.details()["prompt_loose"] is True


def test_loose_variants_include_the_response_and_skip_empty_ones():
    assert loose_variants("Sure!\nbody\nBye")[:4] == [
        "Sure!\nbody\nBye",
        "body\nBye",
        "Sure!\nbody",
        "body",
    ]
    assert loose_variants("*only*") == ["*only*", "only"]
    assert loose_variants("   ") == []


def test_prompt_level_needs_every_instruction_and_loose_never_below_strict():
    gold = [
        {"id": "case_lowercase"},
        {"id": "no_commas"},
        {"id": "length_words_max", "kwargs": {"n": 3}},
    ]
    r = grade_instructions("hello, there world", gold)  # an already parsed list works too
    assert r.strict == (True, False, True) and not r.prompt_strict
    assert all(s <= lo for s, lo in zip(r.strict, r.loose, strict=False))
    ok = grade_instructions("hello there world", gold)
    assert ok.prompt_strict and ok.prompt_loose and ok.grade_fields()["correct"] is True


def test_only_text_after_thinking_is_checked():
    gold = '[{"id": "case_uppercase"}, {"id": "no_commas"}]'
    assert grade_instructions(
        "<think>Hmm, lowercase, commas.</think>\nALL CAPS HERE", gold
    ).prompt_strict
    open_think = grade_instructions("<think>STILL THINKING", gold)
    assert open_think.status == "no_answer" and not open_think.prompt_loose
    assert grade_instructions("   ", '[{"id": "no_commas"}]').loose == (
        False,
    )  # empty never follows


@pytest.mark.parametrize(
    ("gold", "message"),
    [
        (
            '[{"id": "length_words_maximum", "kwargs": {"n": 5}}]',
            "unknown instruction id 'length_words_maximum'",
        ),
        ('[{"id": "length_words_max"}]', "instruction 'length_words_max': bad kwargs"),
        (
            '[{"id": "length_words_max", "kwargs": {"n": 5, "m": 1}}]',
            "instruction 'length_words_max': bad kwargs",
        ),
        ('[{"id": "length_words_max", "kwargs": {"n": "5"}}]', "kwarg 'n' must be a count"),
        (
            '[{"id": "keywords_include", "kwargs": {"keywords": "cat"}}]',
            "'keywords_include': kwarg 'keywords'",
        ),
        ('[{"id": "title", "kwargs": {"at_start": 1}}]', "'title': kwarg 'at_start' must be bool"),
        ('[{"id": "no_commas", "kwargs": []}]', "'no_commas': kwargs must be an object"),
        ('[{"name": "no_commas"}]', "instruction spec must be"),
        ("[]", "non-empty JSON list"),
        ("not json", "not valid JSON"),
    ],
)
def test_bad_golds_raise_naming_the_problem(gold, message):
    with pytest.raises(InstructionError, match=message.replace("(", r"\(")):
        grade_instructions("anything", gold)


def test_shipped_benchmark_is_well_formed():
    rows = read_jsonl(str(REPO / "config" / "benchmarks" / "tinyifeval.jsonl"))
    assert len(rows) == 20 and len({r["prompt_id"] for r in rows}) == 20
    for row in rows:
        assert (
            set(row) == {"prompt_id", "prompt", "answer", "kind"} and row["kind"] == "instructions"
        )
        assert isinstance(row["answer"], str) and parse_instructions(row["answer"])
