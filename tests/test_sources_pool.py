import pytest

from stillroom import pool, sources
from stillroom.ids import normalize_prompt, prompt_id, shard_of
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.teachers import make_teacher

from .conftest import REPO

TINYBENCH = str(REPO / "config" / "benchmarks" / "tinybench.jsonl")


def test_prompt_id_is_stable_and_normalised():
    assert prompt_id("What is  2 + 2?\n", "s") == prompt_id("What is 2 + 2?", "s")
    assert prompt_id("What is 2 + 2?", "s") != prompt_id("What is 2 + 2?", "t")
    assert prompt_id("What is 2 + 2?", "s") != prompt_id("what is 2 + 2?", "s")  # case kept
    assert normalize_prompt(" a\t b \n") == "a b"
    assert len(prompt_id("x", "s")) == 16


def test_generators_are_deterministic_distinct_and_checkable():
    a = sources.generate("arithmetic", "arith", 300, seed=7)
    assert a == sources.generate("arithmetic", "arith", 300, seed=7)
    assert a != sources.generate("arithmetic", "arith", 300, seed=8)
    assert len({r["prompt_id"] for r in a}) == 300
    for r in a:  # every worked solution at every detail level ends in the gold answer
        for detail in range(4):
            reasoning, final = sources.worked_solution(r["meta"], r["answer"], detail)
            assert final == f"The answer is \\boxed{{{r['answer']}}}."
    c = sources.generate("choice", "mcq", 200, seed=7)
    for r in c:
        options = r["meta"]["options"]
        assert len(set(options)) == 4 and r["answer"] in "ABCD"
        assert options["ABCD".index(r["answer"])] == r["meta"]["right"]


def test_effort_levels_have_clearly_different_lengths():
    teacher = make_teacher("t", {"backend": "procedural", "error_rate": 0.0})
    probs = sources.generate("arithmetic", "a", 100, 1) + sources.generate("choice", "c", 50, 1)
    mean = {
        e: sum(len(teacher.complete(p, e, 0, 0).text.split()) for p in probs) / len(probs)
        for e in ("low", "medium", "high", "xhigh")
    }
    assert (
        mean["low"]
        < 0.8 * mean["medium"]
        < mean["medium"]
        < mean["high"] / 1.2
        < mean["xhigh"] / 1.2
    )


def test_teacher_error_rate_and_determinism():
    teacher = make_teacher("t", {"backend": "procedural", "error_rate": {"low": 0.5, "high": 0.0}})
    probs = sources.generate("arithmetic", "a", 400, 1)
    wrong = sum(
        f"\\boxed{{{p['answer']}}}" not in teacher.complete(p, "low", 0, 3).text for p in probs
    )
    assert 0.4 < wrong / len(probs) < 0.6
    assert all(f"\\boxed{{{p['answer']}}}" in teacher.complete(p, "high", 0, 3).text for p in probs)
    assert teacher.complete(probs[0], "low", 1, 3) == teacher.complete(probs[0], "low", 1, 3)
    with pytest.raises(ValueError, match="effort 'ultra'"):
        teacher.complete(probs[0], "ultra", 0, 0)
    with pytest.raises(DataError, match="no meta.op"):
        teacher.complete(
            {"prompt_id": "x", "source": "web", "prompt": "hi", "answer": "1", "kind": "math"},
            "low",
            0,
            0,
        )


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


def _params(size=20):
    return {
        "seed": 3,
        "heldout": {"size": size},
        "sources": [
            {"name": "arith", "kind": "arithmetic", "count": 150},
            {"name": "mcq", "kind": "choice", "count": 60},
            {"name": "scraped", "kind": "echo", "benchmark": "tinybench", "count": 5},
        ],
    }


def test_pool_heldout_and_dev_are_disjoint(tmp_path):
    out, held, dev = tmp_path / "pool.jsonl", tmp_path / "held.jsonl", tmp_path / "dev.jsonl"
    paths = {"out_pool": str(out), "out_heldout": str(held), "out_dev": str(dev)}
    params = _params()
    params["heldout"]["dev_size"] = 10
    m = pool.build_pool(
        benchmarks={"tinybench": TINYBENCH}, **paths, params=params, log=lambda _: None
    )
    p, h, d = read_jsonl(out), read_jsonl(held), read_jsonl(dev)
    assert len(h) == 20 and len(d) == m["dev"] == 10 and m["pool"] == len(p) == 150 + 60 + 5 - 30
    ids = [{r["prompt_id"] for r in split} for split in (p, h, d)]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]
    assert all(r["source"] != "scraped" for r in h + d)
    with pytest.raises(DataError, match="more than half"):
        pool.build_pool(
            benchmarks={"tinybench": TINYBENCH},
            **paths,
            params=_params(size=200),
            log=lambda _: None,
        )


def test_shards_follow_prompt_id_not_row_order(tmp_path):
    rows = sources.generate("arithmetic", "a", 100, 1)
    src = tmp_path / "pool.jsonl"
    write_jsonl(src, rows)
    outs = [str(tmp_path / f"s{i}.jsonl") for i in range(3)]
    pool.assign_shards(pool=str(src), out_shards=outs, params={"shards": 3}, log=lambda _: None)
    first = [[r["prompt_id"] for r in read_jsonl(o)] for o in outs]
    write_jsonl(
        src, rows[::-1] + sources.generate("arithmetic", "b", 10, 1)
    )  # reordered and extended
    pool.assign_shards(pool=str(src), out_shards=outs, params={"shards": 3}, log=lambda _: None)
    second = [{r["prompt_id"] for r in read_jsonl(o)} for o in outs]
    for i, ids in enumerate(first):
        assert set(ids) <= second[i] and all(shard_of(pid, 3) == i for pid in ids)
    assert sum(map(len, first)) == 100
