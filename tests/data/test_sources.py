import json
import random
import re
import time

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


def test_distinct_problems_counts_every_arithmetic_prompt_and_no_more():
    """The capacity the sampler refuses counts by is exact: drawing long enough finds every
    arithmetic prompt at max_operand 2, and many more draws find none beyond it."""
    want = sources.distinct_problems("arithmetic", 2)
    rng, seen, draws = random.Random(0), set(), 0
    while len(seen) < want and draws < 2_000_000:
        seen.add(sources._math(rng, 2)[0])
        draws += 1
    assert len(seen) == want == 8220
    for _ in range(100_000):
        seen.add(sources._math(rng, 2)[0])
    assert len(seen) == want
    # choice: the sum template in full (the others are ordered draws of distinct numbers)
    rng, sums = random.Random(0), set()
    for _ in range(60_000):
        prompt, _, meta = sources._choice(rng, 2)
        if meta["op"] == "sum":
            sums.add(prompt)
    assert len(sums) == 24 * (4 + 2 * 10 + 20)
    assert sources.distinct_problems("choice", 2) == 2 * 19 * 18 * 17 * 16 + len(sums) + (
        10 * 9 * 8 // 6 * 9 * 24
    )


@pytest.mark.parametrize(
    "kind, count, max_operand, expected",
    [
        (
            "arithmetic",
            10**15,
            12,
            r"^source 'gen': count 1000000000000000 but only 457200 distinct prompts are "
            r"available \(kind arithmetic, max_operand 12\); lower count$",
        ),
        (
            "arithmetic",
            8221,
            2,
            r"^source 'gen': count 8221 but only 8220 distinct prompts are available \(kind "
            r"arithmetic, max_operand 2\); raise max_operand to 3 or lower count$",
        ),
        (  # max_operand 1000 has room for 10^15, memory does not
            "choice",
            10**15,
            1000,
            r"^source 'gen': count 1000000000000000 is more than the 10000000 prompts a generated "
            r"source may give \(every record is held in memory\); use a dataset source",
        ),
    ],
)
def test_an_impossible_count_fails_before_any_draw(kind, count, max_operand, expected):
    """Issue 29: count 1e15 drew for ever (the guard allowed 50 x count draws)."""
    start = time.monotonic()
    with pytest.raises(DataError, match=expected):
        sources.generate(kind, "gen", count, seed=0, max_operand=max_operand)
    assert time.monotonic() - start < 1


def test_a_large_count_within_reach_is_drawn_and_a_stalled_one_is_named(monkeypatch):
    rows = sources.generate("arithmetic", "gen", 4000, seed=0, max_operand=2)  # half of all
    assert len({r["prompt_id"] for r in rows}) == 4000
    # at the very edge of capacity the rarest prompts can stall the sampler: it stops, naming
    # what it found (STALL draws in a row without a new prompt; a small one to see it here)
    monkeypatch.setattr(sources, "STALL", 200)
    with pytest.raises(
        DataError,
        match=r"^sources.0 \(gen\): only \d+ distinct prompts after \d+ draws, the last 200 "
        r"adding none, of the 8220 that exist \(kind arithmetic, max_operand 2\); lower count "
        r"\(8220\) or raise max_operand$",
    ):
        sources.generate("arithmetic", "gen", 8220, seed=0, max_operand=2, where="sources.0 (gen)")


def test_iter_sources_names_the_source_of_an_impossible_count():
    def specs(count):
        return PoolParams.parse(
            {
                "heldout": {"size": 0},
                "sources": [
                    {"name": "arith", "kind": "arithmetic", "count": 10},
                    {"name": "scraped", "kind": "echo", "benchmark": "tinybench", "count": count},
                ],
            }
        ).sources

    # was: 64 copies of the 64 items, without a word
    with pytest.raises(
        DataError,
        match=r"^sources.1 \(scraped\): count 65 but the benchmark \S+tinybench.jsonl has only "
        r"64 items to copy; lower count$",
    ):
        list(sources.iter_sources(specs(65), {"tinybench": TINYBENCH}, seed=0))
    # every item is a legal count
    assert len(list(sources.iter_sources(specs(64), {"tinybench": TINYBENCH}, seed=0))) == 74


def test_a_benchmark_listing_a_problem_twice_names_both_lines(tmp_path):
    """Issue 29: found only when evaluation started, naming the file but not the lines."""
    bench = tmp_path / "b.jsonl"
    rows = [
        {"prompt": "What is 2 + 2?", "answer": "4", "kind": "math"},
        {"prompt": "What is 3 + 3?", "answer": "6", "kind": "math"},
        {"prompt": "What is  2 +\t2? ", "answer": "4", "kind": "math"},  # the same, normalised
    ]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]) + "\n" + json.dumps(rows[2]))
    with pytest.raises(
        DataError,
        match=r"^benchmark 'aime': \S+b.jsonl:4: the prompt is also line 1's \(prompt id "
        r"[0-9a-f]{16}, from the text with whitespace and Unicode normalised\); a benchmark lists "
        r"each problem once \(drop one of lines 1 and 4\)$",
    ):
        sources.load_benchmark(str(bench), "benchmark 'aime'", benchmark="aime")
    assert len(sources.load_benchmark(str(bench))) == 3  # a source's rows: the pool dedupes them
    with_ids = [{**r, "prompt_id": pid} for r, pid in zip(rows, ["a", "b", "b"], strict=True)]
    bench.write_text("".join(json.dumps(r) + "\n" for r in with_ids))
    with pytest.raises(
        DataError, match=r"b.jsonl:3: key 'prompt_id' 'b' is also line 2's; a benchmark lists"
    ):
        sources.load_benchmark(str(bench), benchmark="aime")
    bench.write_text(json.dumps(rows[0]) + "\n")
    (item,) = sources.load_benchmark(str(bench), benchmark="aime")
    assert item["prompt_id"] == sources.prompt_id(rows[0]["prompt"], "aime")


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
