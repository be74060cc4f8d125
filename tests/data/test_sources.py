import json
import re

import pytest

from stillroom.config import DatasetSpec
from stillroom.data import sources
from stillroom.io import DataError
from stillroom.stages.pool import PoolParams

from ..conftest import REPO

TINYBENCH = str(REPO / "config" / "benchmarks" / "tinybench.jsonl")


def test_generators_are_deterministic_distinct_and_checkable():
    a = sources.generate("arithmetic", "arith", 300, seed=7, max_operand=12)
    assert a == sources.generate("arithmetic", "arith", 300, seed=7, max_operand=12)
    assert a != sources.generate("arithmetic", "arith", 300, seed=8, max_operand=12)
    assert len({r["prompt_id"] for r in a}) == 300
    for r in a:  # every worked solution at every detail level ends in the gold answer
        for detail in range(4):
            reasoning, final = sources.worked_solution(r["meta"], r["answer"], detail)
            assert final == f"The answer is \\boxed{{{r['answer']}}}."
    c = sources.generate("choice", "mcq", 200, seed=7, max_operand=12)
    for r in c:
        options = r["meta"]["options"]
        assert len(set(options)) == 4 and r["answer"] in "ABCD"
        assert options["ABCD".index(r["answer"])] == r["meta"]["right"]


def test_echo_copies_benchmark_items_with_noise():
    rows = sources.echo("scraped", TINYBENCH, 10, seed=1)
    bench = {r["prompt"] for r in sources.load_benchmark(TINYBENCH)}
    assert len(rows) == 10 and all(r["prompt"] not in bench for r in rows)


def test_bad_benchmark_rows_name_file_line_and_key(tmp_path):
    bad = tmp_path / "b.jsonl"
    bad.write_text(
        '{"prompt": "p", "answer": "1", "kind": "math"}\n{"prompt": "q", "kind": "math"}\n'
    )
    with pytest.raises(DataError, match=r"b.jsonl:2: missing key 'answer'"):
        sources.load_benchmark(str(bad))
    bad.write_text('{"prompt": "p", "answer": "1", "kind": "essay"}\n')
    with pytest.raises(DataError, match=r"b.jsonl:1: key 'kind'"):
        sources.load_benchmark(str(bad))


def _write(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    if name.endswith(".parquet"):
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("name", ["data.jsonl", "data.parquet"])
def test_dataset_source_maps_fields_and_filters(tmp_path, name):
    rows = [
        {"question": f"What is {i} squared?", "final_answer": i * i, "difficulty": i % 10}
        for i in range(40)
    ]
    spec = {
        "name": "deepmath",
        "kind": "dataset",
        "path": _write(tmp_path, rows, name),
        "prompt": "question",
        "answer": "final_answer",
        "answer_kind": "math",
        "where": {"difficulty": {"min": 5}},
        "limit": 15,
    }
    specs = PoolParams.parse({"sources": [spec], "heldout": {"size": 0}}).sources
    out = list(sources.iter_sources(specs, {}, seed=0))
    assert len(out) == 15 and all(r["source"] == "deepmath" and r["kind"] == "math" for r in out)
    assert (
        out[0]["prompt"] == "What is 5 squared?"
        and out[0]["answer"] == "25"
        and out[0]["meta"] == {"row": 5}
    )


def test_dataset_source_errors_name_the_field_and_row(tmp_path):
    path = _write(tmp_path, [{"q": "a", "a": "1"}, {"q": "", "a": "2"}])
    with pytest.raises(DataError, match=r"has no field 'question' \(fields: q, a\)"):
        list(
            sources.dataset_records(
                DatasetSpec.parse({"path": path, "prompt": "question", "answer": "a"}), "s"
            )
        )
    with pytest.raises(DataError, match=r"row 1: field 'q' is empty"):
        list(
            sources.dataset_records(
                DatasetSpec.parse({"path": path, "prompt": "q", "answer": "a"}), "s"
            )
        )
    with pytest.raises(DataError, match="file not found"):
        list(
            sources.dataset_records(
                DatasetSpec.parse({"path": str(tmp_path / "missing.parquet")}), "s"
            )
        )


def test_multiple_choice_options_are_shuffled_into_letters_per_problem(tmp_path):
    """GPQA-Diamond's layout: the right answer and three wrong ones in their own fields."""
    fields = ["Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]
    rows = [
        {"Question": f"Which particle is number {i}?", **{f: f"{f} of {i}" for f in fields}}
        for i in range(40)
    ]
    spec = DatasetSpec.parse(
        {
            "path": _write(tmp_path, rows),
            "prompt": "Question",
            "answer_kind": "choice",
            "choices": fields,
        }
    )
    out = list(sources.dataset_records(spec, "gpqa"))
    assert out == list(sources.dataset_records(spec, "gpqa"))  # the same order every run
    for i, r in enumerate(out):
        listed = dict(re.findall(r"\(([A-Z])\) (.+?)(?= \([A-Z]\) |$)", r["prompt"]))
        assert sorted(listed) == ["A", "B", "C", "D"] and r["kind"] == "choice"
        assert listed[r["answer"]] == f"Correct Answer of {i}"
    # the right letter is spread over the letters, not always A
    assert len({r["answer"] for r in out}) == 4
    with pytest.raises(ValueError, match="choices: options are lettered for answer_kind: choice"):
        DatasetSpec.parse({"path": "x.jsonl", "choices": fields})


def test_ifeval_rows_keep_all_their_instructions_and_unknown_ones_are_errors(tmp_path):
    from stillroom.grading.instructions import grade_instructions

    none = {"relation": None, "num_words": None, "end_phrase": None, "forbidden_words": None}
    rows = [
        {
            "key": 1,
            "prompt": "Describe the sea in fewer than 5 words, no commas.",
            "instruction_id_list": ["length_constraints:number_words", "punctuation:no_comma"],
            "kwargs": [{**none, "relation": "less than", "num_words": 5}, dict(none)],
        },
        {
            "key": 2,
            "prompt": "Write a haiku wrapped in double quotes.",
            "instruction_id_list": ["startend:quotation", "punctuation:no_comma"],
            "kwargs": [dict(none), dict(none)],
        },
    ]
    spec = DatasetSpec.parse({"path": _write(tmp_path, rows), "answer_kind": "ifeval"})
    out = list(sources.dataset_records(spec, "ifeval"))
    assert [r["kind"] for r in out] == ["instructions", "instructions"]
    gold = json.loads(out[0]["answer"])  # IFEval's ids, the null kwargs dropped
    assert gold == [
        {
            "id": "length_constraints:number_words",
            "kwargs": {"relation": "less than", "num_words": 5},
        },
        {"id": "punctuation:no_comma", "kwargs": {}},
    ]
    assert grade_instructions("calm blue endless water", out[0]["answer"]).prompt_strict
    assert not grade_instructions("calm, blue, endless, deep water", out[0]["answer"]).prompt_strict
    assert grade_instructions('"Calm blue sea"', out[1]["answer"]).prompt_strict
    assert not grade_instructions("Calm blue sea", out[1]["answer"]).prompt_strict
    for bad, message in [
        ({**rows[0], "kwargs": [dict(none), dict(none)]}, r"row 0: .*missing kwargs num_words"),
        (
            {**rows[1], "instruction_id_list": ["startend:quotation", "detectable_format:rhyme"]},
            r"row 0: unknown instruction id 'detectable_format:rhyme'",
        ),
        (
            {**rows[1], "kwargs": [dict(none)]},
            r"row 0: instruction_id_list and kwargs do not match",
        ),
    ]:
        path = _write(tmp_path, [bad], "bad.jsonl")
        spec = DatasetSpec.parse({"path": path, "answer_kind": "ifeval"})
        with pytest.raises(DataError, match=message):
            list(sources.dataset_records(spec, "ifeval"))


def test_humaneval_rows_become_code_problems_graded_by_their_own_tests(tmp_path):
    """openai_humaneval's layout: a function stub, its check(candidate) and the name it calls; the
    stub keeps its lines and indentation, asked inside the configured instruction."""
    from stillroom.grading.code import grade_code

    stub = 'def add(a, b):\n    """Return a + b."""\n'
    rows = [
        {
            "task_id": "HumanEval/0",
            "prompt": stub,
            "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
            "entry_point": "add",
        }
    ]
    spec = DatasetSpec.parse(
        {
            "path": _write(tmp_path, rows),
            "answer": "test",
            "answer_kind": "code",
            "entry_point": "entry_point",
            "prompt_template": "Complete this function.\n\n$prompt",
        }
    )
    [rec] = sources.dataset_records(spec, "humaneval")
    assert rec["kind"] == "code" and rec["prompt"] == f"Complete this function.\n\n{stub}"
    right = f"```python\n{stub}    return a + b\n```"
    assert grade_code(right, rec["answer"]).passed
    assert not grade_code(right.replace("a + b\n", "a - b\n"), rec["answer"]).passed
    # MBPP's layout: a list of asserts
    mbpp = [{"text": "Write add(a, b).", "test_list": ["assert add(1, 1) == 2"]}]
    spec = DatasetSpec.parse(
        {
            "path": _write(tmp_path, mbpp, "mbpp.jsonl"),
            "prompt": "text",
            "answer": "test_list",
            "answer_kind": "code",
        }
    )
    [rec] = sources.dataset_records(spec, "mbpp")
    assert json.loads(rec["answer"]) == {"tests": ["assert add(1, 1) == 2"]}
    with pytest.raises(ValueError, match="entry_point: for answer_kind: code only"):
        DatasetSpec.parse({"path": "x.jsonl", "entry_point": "entry_point"})
    with pytest.raises(ValueError, match="prompt_template"):
        DatasetSpec.parse({"path": "x.jsonl", "prompt_template": "no placeholder"})
