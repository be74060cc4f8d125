"""IFEval's instructions graded by lm-eval's checks: all 25 ids, agreement with the reference
implementation's own test cases, strict and loose scoring, gold validation, the offline Punkt
model and the shipped benchmark."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stillroom.grading import punkt_data
from stillroom.grading.instructions import (
    InstructionError,
    grade_instructions,
    instruction_ids,
    parse_instructions,
)
from stillroom.io import read_jsonl

from ..conftest import REPO

CASES = [  # (IFEval id, kwargs, a response that follows it, one that does not)
    ("keywords:existence", {"keywords": ["cat", "hat"]}, "The cat wore a hat.", "The cat sat."),
    (
        "keywords:frequency",
        {"keyword": "sea", "frequency": 2, "relation": "at least"},
        "The sea, the sea, always the sea.",
        "The sea is calm.",
    ),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["cheap"]},
        "Durable and well made.",
        "It is Cheap!",
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 3, "let_relation": "less than"},
        "A lazy dog.",
        "Zebras zigzag in the zoo.",
    ),
    (
        "language:response_language",
        {"language": "de"},
        "Der Hund spielt heute im Garten mit dem Ball.",
        "The dog is playing in the garden with the ball today.",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 3, "relation": "less than"},
        "One short sentence. Then a second one.",
        "One. Two. Three. Four.",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "First paragraph.\n***\nSecond paragraph.",
        "Only one paragraph here.",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "This answer has six words.",
        "Too short.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
        "First we wait.\n\nThen we go.",
        "First we wait.\n\nNow we go.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], see you at [address].",
        "Dear [name], see you soon.",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "See you soon.\n\nP.S. Bring a coat.",
        "See you soon. Bring a coat.",
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "* apples\n* pears",
        "* apples, nothing else",
    ),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Probably yes."),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "Two *key* and *vital* points.",
        "Only one *key* point.",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "Section", "num_sections": 2},
        "Section 1\nIntro.\nSection 2\nBody.",
        "Intro.\nSection 1\nBody.",
    ),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', 'Here: {"a": 1}'),
    ("detectable_format:title", {}, "<<Autumn>>\nLeaves fall.", "Autumn\nLeaves fall."),
    (
        "combination:two_responses",
        {},
        "Tea is calming.\n******\nCoffee is bracing.",
        "Tea is calming. Coffee is bracing.",
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Name a colour."},
        "Name a colour. Blue.",
        "Blue.",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Done. Any other questions?",
        "Any other questions? Done.",
    ),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "This is VERY IMPORTANT news.",
        "This is VERY important news.",
    ),
    (
        "change_case:english_capital",
        {},
        "THIS WHOLE ANSWER IS WRITTEN IN CAPITAL LETTERS FOR THE READER.",
        "This whole answer is written in mixed case letters for the reader.",
    ),
    (
        "change_case:english_lowercase",
        {},
        "this whole answer is written in lowercase letters for the reader.",
        "This whole answer is written in mixed case letters for the reader.",
    ),
    ("punctuation:no_comma", {}, "No commas here.", "Well, one comma."),
    ("startend:quotation", {}, '"A quoted answer."', "An unquoted answer."),
]

# Google's IFEval unit tests (google-research instruction_following_eval/instructions_test.py):
# each case's response, kwargs and expected verdict, as data (the package ships no tests).
REFERENCE = read_jsonl(str(REPO / "tests" / "grading" / "data" / "ifeval_reference_cases.jsonl"))


def test_all_25_ifeval_instruction_ids_are_implemented_and_exercised():
    assert len(instruction_ids()) == 25
    assert {c[0] for c in CASES} == set(instruction_ids())


@pytest.mark.parametrize(("id_", "kwargs", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_each_instruction_accepts_and_rejects(id_, kwargs, good, bad):
    gold = [{"id": id_, "kwargs": kwargs}]
    assert grade_instructions(good, gold).strict == (True,)
    rejected = grade_instructions(bad, gold)
    assert rejected.strict == (False,) and rejected.loose == (False,)


def test_agrees_with_the_reference_implementations_own_test_cases():
    assert len(REFERENCE) == 46 and len({r["id"] for r in REFERENCE}) == 13
    got = [
        grade_instructions(r["response"], [{"id": r["id"], "kwargs": r["kwargs"]}]).strict[0]
        for r in REFERENCE
    ]
    disagree = [
        (r["test"], r["id"], r["kwargs"])
        for r, g in zip(REFERENCE, got, strict=True)
        if g != r["expected"]
    ]
    assert not disagree


def test_preamble_line_fails_strict_but_passes_loose():
    response = (
        'Sure! Here is the JSON you asked for:\n```json\n{"title": "Dune", "year": 1965}\n```'
    )
    r = grade_instructions(response, '[{"id": "detectable_format:json_format"}]')
    assert r.strict == (False,) and r.loose == (True,)
    assert not r.prompt_strict and r.prompt_loose
    assert r.grade_fields() == {"correct": False, "extracted": None, "status": "ok"}


def test_prompt_and_instruction_level_strict_and_loose_in_the_details():
    gold = [
        {"id": "punctuation:no_comma"},
        {
            "id": "length_constraints:number_words",
            "kwargs": {"relation": "less than", "num_words": 8},
        },
        {"id": "startend:quotation"},
    ]
    r = grade_instructions('**"Calm**, blue sea."', gold)  # the asterisks hide the quotes
    assert r.details() == {
        "ids": [g["id"] for g in gold],
        "strict": [False, True, False],
        "loose": [False, True, True],
        "prompt_strict": False,
        "prompt_loose": False,
    }
    ok = grade_instructions('"Calm blue sea."', gold)
    assert ok.prompt_strict and ok.prompt_loose and ok.grade_fields()["correct"] is True


def test_only_text_after_thinking_is_checked():
    gold = '[{"id": "change_case:english_capital"}, {"id": "punctuation:no_comma"}]'
    answer = "<think>Hmm, lowercase, commas.</think>\nALL OF THIS ANSWER IS WRITTEN IN CAPITALS"
    assert grade_instructions(answer, gold).prompt_strict
    open_think = grade_instructions("<think>STILL THINKING", gold)
    assert open_think.status == "no_answer" and not open_think.prompt_loose
    assert grade_instructions("   ", '[{"id": "punctuation:no_comma"}]').loose == (False,)


@pytest.mark.parametrize(
    ("gold", "message"),
    [
        ('[{"id": "detectable_format:rhyme"}]', "unknown instruction id 'detectable_format:rhyme'"),
        (
            '[{"id": "length_constraints:number_words", "kwargs": {"num_words": 5}}]',
            "missing kwargs relation",
        ),
        (
            '[{"id": "length_constraints:number_words", "kwargs": {"relation": "under", '
            '"num_words": 5}}]',
            "bad kwargs",
        ),
        (
            '[{"id": "length_constraints:number_words", "kwargs": {"relation": "at least", '
            '"num_words": "5"}}]',
            "bad kwargs",
        ),
        ('[{"id": "punctuation:no_comma", "kwargs": {"n": 1}}]', "bad kwargs"),
        (
            '[{"id": "detectable_format:number_bullet_lists", "kwargs": {"num_bullets": 0}}]',
            "must not be empty or 0",
        ),
        (
            '[{"id": "detectable_format:number_bullet_lists", "kwargs": {"num_bullets": -1}}]',
            "'num_bullets' = -1 is not a value it accepts",
        ),
        ('[{"id": "keywords:existence", "kwargs": {"keywords": "cat"}}]', "'keywords' = 'cat'"),
        (
            '[{"id": "keywords:letter_frequency", "kwargs": {"letter": "ab", "let_frequency": 2, '
            '"let_relation": "at least"}}]',
            "'letter' = 'ab' is not a value it accepts",
        ),
        ('[{"id": "punctuation:no_comma", "kwargs": []}]', "kwargs must be an object"),
        ('[{"name": "punctuation:no_comma"}]', "instruction spec must be"),
        ("[]", "non-empty JSON list"),
        ("not json", "not valid JSON"),
    ],
)
def test_bad_golds_raise_naming_the_problem(gold, message):
    with pytest.raises(InstructionError, match=message.replace("(", r"\(")):
        grade_instructions("anything", gold)


_OFFLINE = """
import socket, sys
import nltk

def refuse(*args, **kwargs):
    raise AssertionError("network or NLTK download attempted")

nltk.download = refuse
socket.socket.connect = refuse
socket.create_connection = refuse
if len(sys.argv) > 1:
    nltk.data.path[:] = [sys.argv[1]]  # an NLTK data directory without the Punkt model
from stillroom.grading.instructions import grade_instructions
sentences = {"relation": "less than", "num_sentences": 3}
capitals = {"capital_relation": "at least", "capital_frequency": 1}
gold = [
    {"id": "length_constraints:number_sentences", "kwargs": sentences},
    {"id": "change_case:capital_word_frequency", "kwargs": capitals},
]
answer = "Mr. Smith met Dr. Jones at 5 p.m. on the RIVER. They talked."
print(grade_instructions(answer, gold).strict)
"""


def _offline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _OFFLINE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_grading_runs_offline_with_the_installed_punkt_model():
    """Sentences (Punkt) and words (NLTK's word tokenizer, which needs Punkt too) with every
    download and connection refused; abbreviations do not end a sentence."""
    run = _offline()
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "(True, True)"


def test_a_missing_punkt_model_is_named_never_downloaded(tmp_path):
    run = _offline(str(tmp_path))
    assert run.returncode != 0
    assert "punkt_tab" in run.stderr and "python -m stillroom.grading.punkt_data" in run.stderr
    assert "download attempted" not in run.stderr


def test_punkt_data_writes_the_model_nltk_loads(tmp_path, monkeypatch):
    import nltk
    from nltk.tokenize.punkt import PunktTokenizer

    out = punkt_data.install(tmp_path)
    assert out == tmp_path / punkt_data.RESOURCE
    assert {p.name for p in out.iterdir()} == {
        "collocations.tab",
        "sent_starters.txt",
        "abbrev_types.txt",
        "ortho_context.tab",
    }
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])  # only the model written here
    tokenizer = PunktTokenizer("english")
    text = "Mr. Smith arrived at 5 p.m. on Friday. He left at once! Did he? Yes."
    assert tokenizer.tokenize(text) == [
        "Mr. Smith arrived at 5 p.m. on Friday.",
        "He left at once!",
        "Did he?",
        "Yes.",
    ]


def test_shipped_benchmark_is_well_formed():
    rows = read_jsonl(str(REPO / "config" / "benchmarks" / "tinyifeval.jsonl"))
    assert len(rows) == 20 and len({r["prompt_id"] for r in rows}) == 20
    for row in rows:
        assert (
            set(row) == {"prompt_id", "prompt", "answer", "kind"} and row["kind"] == "instructions"
        )
        assert all(":" in spec.id for spec in parse_instructions(row["answer"]))
