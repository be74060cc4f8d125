import pytest

from stillroom.data import sources
from stillroom.ids import shard_of
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.stages import pool

from ..conftest import REPO
from ..data.test_sources import _write

TINYBENCH = str(REPO / "config" / "benchmarks" / "tinybench.jsonl")


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


def test_the_splits_can_be_carved_from_named_sources(tmp_path):
    """A real recipe's dev split comes from its dataset sources, not from generated problems."""
    rows = [{"question": f"What is {i} cubed?", "final": i**3} for i in range(40)]
    params = _params(size=0)
    params["sources"].append(
        {
            "name": "deepmath",
            "kind": "dataset",
            "path": _write(tmp_path, rows),
            "prompt": "question",
            "answer": "final",
        }
    )
    params["heldout"] = {"size": 0, "dev_size": 8, "sources": ["deepmath"]}
    paths = {k: str(tmp_path / f"{k}.jsonl") for k in ("out_pool", "out_heldout", "out_dev")}
    pool.build_pool(benchmarks={"tinybench": TINYBENCH}, **paths, params=params, log=print)
    dev = read_jsonl(paths["out_dev"])
    assert len(dev) == 8 and {r["source"] for r in dev} == {"deepmath"}
    params["heldout"]["dev_size"] = 30
    with pytest.raises(DataError, match="more than half of the 40 problems of deepmath"):
        pool.build_pool(benchmarks={"tinybench": TINYBENCH}, **paths, params=params, log=print)


def test_shards_follow_prompt_id_not_row_order(tmp_path):
    rows = sources.generate("arithmetic", "a", 100, 1, max_operand=12)
    src = tmp_path / "pool.jsonl"
    write_jsonl(src, rows)
    outs = [str(tmp_path / f"s{i}.jsonl") for i in range(3)]
    pool.assign_shards(pool=str(src), out_shards=outs, params={"shards": 3}, log=lambda _: None)
    first = [[r["prompt_id"] for r in read_jsonl(o)] for o in outs]
    write_jsonl(
        src, rows[::-1] + sources.generate("arithmetic", "b", 10, 1, max_operand=12)
    )  # reordered and extended
    pool.assign_shards(pool=str(src), out_shards=outs, params={"shards": 3}, log=lambda _: None)
    second = [{r["prompt_id"] for r in read_jsonl(o)} for o in outs]
    for i, ids in enumerate(first):
        assert set(ids) <= second[i] and all(shard_of(pid, 3) == i for pid in ids)
    assert sum(map(len, first)) == 100


def test_a_problem_file_shared_by_train_and_test_would_fail_the_pool(tmp_path):
    """The held-out split is carved from the kernel problems themselves, disjoint by id."""
    out = {k: str(tmp_path / f"{k}.jsonl") for k in ("pool", "heldout", "dev")}
    m = pool.build_pool(
        benchmarks={},
        out_pool=out["pool"],
        out_heldout=out["heldout"],
        out_dev=out["dev"],
        params={"seed": 0, "sources": [{"name": "kb", "kind": "kernels"}], "heldout": {"size": 12}},
        log=lambda _: None,
    )
    held = {r["prompt_id"] for r in read_jsonl(out["heldout"])}
    pool_ids = {r["prompt_id"] for r in read_jsonl(out["pool"])}
    assert m["heldout"] == 12 and not held & pool_ids and len(held | pool_ids) == m["pool"] + 12


def test_benchmark_from_a_dataset_spec(tmp_path):
    path = _write(
        tmp_path, [{"problem": f"Find {i} + {i}.", "answer": str(2 * i)} for i in range(5)]
    )
    out = tmp_path / "bench.jsonl"
    m = pool.fetch_benchmark(
        out_benchmark=str(out),
        log=lambda _: None,
        params={
            "name": "aime",
            "spec": {"path": path, "prompt": "problem", "answer": "answer", "answer_kind": "math"},
        },
    )
    rows = read_jsonl(out)
    assert m["items"] == 5 and rows[1] == {
        "prompt_id": rows[1]["prompt_id"],
        "prompt": "Find 1 + 1.",
        "answer": "2",
        "kind": "math",
    }
    assert sources.load_benchmark(str(out))  # the format every stage reads
