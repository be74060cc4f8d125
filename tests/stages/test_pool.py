import json

import pytest

from stillroom.config import Experiment, merge_configs
from stillroom.data import sources
from stillroom.ids import shard_of
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.stages import pool

from ..conftest import REPO, default_config
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


def _build(tmp_path, sources_, benchmarks=None):
    return pool.build_pool(
        benchmarks=benchmarks or {},
        **{k: str(tmp_path / f"{k}.jsonl") for k in ("out_pool", "out_heldout", "out_dev")},
        params={"heldout": {"size": 0}, "sources": sources_},
        log=lambda _: None,
    )


def _rows(tmp_path, name, rows):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"kind": "math", **r}) + "\n" for r in rows))
    return str(path)


def test_one_prompt_with_two_answers_is_an_error_naming_both_rows(tmp_path):
    """Issue 29: the first row won silently ("duplicates dropped: 1"). One prompt is one
    normalised text (what its id hashes), in one source or across two."""
    web = _rows(
        tmp_path,
        "web.jsonl",
        [
            {"prompt": "What is 2 + 2?", "answer": "4"},
            {"prompt": "What is 3 + 3?", "answer": "6"},
            {"prompt": "What is  2 +\t2? ", "answer": "5"},
        ],
    )
    with pytest.raises(
        DataError,
        match=r"^source 'web' \(\S+web.jsonl:1\) and source 'web' \(\S+web.jsonl:3\) give one "
        r"prompt different answers: '4' and '5'; a prompt has one gold answer: fix or drop one "
        r"of the rows \(prompt: 'What is 2 \+ 2\?'\)$",
    ):
        _build(tmp_path, [{"name": "web", "kind": "jsonl", "path": web}])
    # across sources: a dataset row against a JSONL line, the kind differing too
    ok = _rows(tmp_path, "ok.jsonl", [{"prompt": "What is 3 + 3?", "answer": "6"}])
    table = _write(
        tmp_path,
        [{"prompt": "Pick one.", "answer": "B"}, {"prompt": "What is 3 + 3?", "answer": "C"}],
        "table.jsonl",
    )
    dataset = {"name": "hub", "kind": "dataset", "path": table, "answer_kind": "choice"}
    with pytest.raises(
        DataError,
        match=r"^source 'web' \(\S+ok.jsonl:1\) and source 'hub' \(\S+table.jsonl row 1\) give "
        r"one prompt different answers: '6' \(kind math\) and 'C' \(kind choice\);",
    ):
        _build(tmp_path, [{"name": "web", "kind": "jsonl", "path": ok}, dataset])


def test_identical_copies_of_a_prompt_are_dropped_and_counted(tmp_path):
    web = _rows(
        tmp_path,
        "web.jsonl",
        [
            {"prompt": "What is 2 + 2?", "answer": "4"},
            {"prompt": "What is 3 + 3?", "answer": "6"},
            {"prompt": "What is 2 +  2?", "answer": " 4"},  # the same prompt and answer
        ],
    )
    again = _rows(tmp_path, "again.jsonl", [{"prompt": "What is 3 + 3?", "answer": "6"}])
    m = _build(
        tmp_path,
        [
            {"name": "web", "kind": "jsonl", "path": web},
            {"name": "again", "kind": "jsonl", "path": again},  # was kept: another id
        ],
    )
    assert m["pool"] == 2 and m["duplicates_dropped"] == 2 and m["per_source"] == {"web": 2}
    kept = read_jsonl(tmp_path / "out_pool.jsonl")
    assert [(r["prompt"], r["answer"]) for r in kept] == [
        ("What is 2 + 2?", "4"),
        ("What is 3 + 3?", "6"),
    ]


def test_a_benchmark_listing_a_problem_twice_stops_the_pool(tmp_path):
    """Issue 29: the pool job is the first to read every benchmark (caught only when evaluation
    started, naming no line)."""
    lines = (REPO / "config" / "benchmarks" / "tinybench.jsonl").read_text().splitlines()
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(lines[:3] + [lines[1]]) + "\n")
    pid = json.loads(lines[1])["prompt_id"]
    with pytest.raises(
        DataError,
        match=rf"^benchmark 'tinybench': \S+bench.jsonl:4: key 'prompt_id' '{pid}' is also line "
        r"2's; a benchmark lists each problem once \(drop one of lines 2 and 4\)$",
    ):
        _build(
            tmp_path,
            [{"name": "arith", "kind": "arithmetic", "count": 20}],  # no source reads it
            {"tinybench": str(bench)},
        )


def test_a_dataset_benchmark_listing_a_problem_twice_names_both_rows(tmp_path):
    rows = [{"problem": f"Find {i} + {i}.", "answer": str(2 * i)} for i in range(4)]
    path = _write(tmp_path, [*rows, {**rows[1], "problem": " Find 1 +  1."}])
    with pytest.raises(
        DataError,
        match=r"^benchmark 'aime': \S+data.jsonl rows 1 and 4 give the same prompt \(prompt id "
        r"[0-9a-f]{16}, from the text with whitespace and Unicode normalised\); a benchmark lists "
        r"each problem once: filter one out \(where\) or dedupe the file$",
    ):
        pool.fetch_benchmark(
            out_benchmark=str(tmp_path / "bench.jsonl"),
            log=lambda _: None,
            params={"name": "aime", "spec": {"path": path, "prompt": "problem"}},
        )
    assert not (tmp_path / "bench.jsonl").exists()


def test_the_pool_jobs_params_resolve_local_files_against_the_repository(tmp_path):
    local = {"name": "mine", "kind": "jsonl", "path": "data/mine.jsonl"}
    config = default_config()
    config = merge_configs(config, {"sources": [*config["sources"], local]})
    config["benchmarks"]["hub"] = {"path": "org/set", "prompt": "q", "answer_kind": "math"}
    config["benchmarks"]["file"] = {"path": "data/b.jsonl", "prompt": "q", "answer_kind": "math"}
    exp = Experiment.parse(config)
    job = json.loads(pool.pool_job_params(exp, tmp_path).as_param())
    assert job["seed"] == exp.seed and job["heldout"] == exp.heldout.dump()
    # a local file: absolute, so a job in another working directory finds it; others as they are
    assert job["sources"][-1]["path"] == str(tmp_path / "data/mine.jsonl")
    assert job["sources"][:-1] == [s.dump() for s in exp.sources[:-1]]
    hub = pool.benchmark_job_params(exp, "hub", tmp_path)
    assert hub.name == "hub" and hub.spec.path == "org/set"
    assert pool.benchmark_job_params(exp, "file", tmp_path).spec.path == str(
        tmp_path / "data/b.jsonl"
    )
    assert pool.shard_job_params(exp).shards == exp.generation.shards
