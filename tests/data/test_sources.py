import pytest

from stillroom.data import sources
from stillroom.io import DataError

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
