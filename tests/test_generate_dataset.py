import json

import pytest

from stillroom import dataset, generate, grading, sources
from stillroom.io import DataError, read_jsonl, write_jsonl

SPEC = {"backend": "procedural", "error_rate": {"low": 0.4, "medium": 0.2}}


def _shard(tmp_path, n=40):
    path = tmp_path / "shard.jsonl"
    write_jsonl(
        path, sources.generate("arithmetic", "a", n, 1) + sources.generate("choice", "c", n // 2, 1)
    )
    return str(path)


def _generate(shard, out, effort="low", k=2):
    return generate.run(
        shard=shard,
        out_samples=out,
        log=lambda _: None,
        params={"teacher": "proc", "spec": SPEC, "effort": effort, "samples": k, "seed": 5},
    )


def test_generation_writes_one_record_per_sample_key(tmp_path):
    out = str(tmp_path / "gen.jsonl")
    m = _generate(_shard(tmp_path), out)
    rows = read_jsonl(out)
    assert m["samples"] == len(rows) == 60 * 2
    assert len({r["key"] for r in rows}) == len(rows)
    assert {r["sample_index"] for r in rows} == {0, 1}
    assert all(r["finish_reason"] == "stop" and r["response"].startswith("<think>") for r in rows)
    assert not (tmp_path / "gen.jsonl.partial").exists()


def test_generation_resumes_after_a_torn_write(tmp_path):
    shard, out = _shard(tmp_path), str(tmp_path / "gen.jsonl")
    _generate(shard, out)
    full = read_jsonl(out)
    # A killed run: 7 complete records and half of the 8th, and no final file.
    partial = tmp_path / "gen.jsonl.partial"
    lines = [json.dumps(r, sort_keys=True) for r in full[:8]]
    partial.write_text("\n".join(lines[:7]) + "\n" + lines[7][: len(lines[7]) // 2])
    (tmp_path / "gen.jsonl").unlink()
    logs = []
    generate.run(
        shard=shard,
        out_samples=out,
        log=logs.append,
        params={"teacher": "proc", "spec": SPEC, "effort": "low", "samples": 2, "seed": 5},
    )
    resumed = read_jsonl(out)
    assert [r["key"] for r in resumed] == [r["key"] for r in full]
    assert [r["response"] for r in resumed] == [r["response"] for r in full]
    assert any("torn" in line for line in logs) and any(
        "7 samples already done" in line for line in logs
    )


def test_grading_stage_rejects_teacher_slips(tmp_path):
    gen, graded = str(tmp_path / "gen.jsonl"), str(tmp_path / "graded.jsonl")
    _generate(_shard(tmp_path), gen)
    m = grading.run(samples=gen, out_graded=graded, params={}, log=lambda _: None)
    rows = read_jsonl(graded)
    for r in rows:  # a procedural answer is correct exactly when it boxes the gold
        assert r["grade"]["correct"] == (f"\\boxed{{{r['answer']}}}" in r["response"])
    assert 0.25 < 1 - m["correct"] / m["samples"] < 0.55  # error_rate 0.4 at low effort
    assert m["status"] == {"ok": len(rows)}


def _graded(tmp_path):
    shard, paths = _shard(tmp_path, 60), {}
    for effort in ("low", "medium"):
        gen, graded = (
            str(tmp_path / f"gen-{effort}.jsonl"),
            str(tmp_path / f"graded-{effort}.jsonl"),
        )
        _generate(shard, gen, effort, k=3)
        grading.run(samples=gen, out_graded=graded, params={}, log=lambda _: None)
        paths[effort] = graded
    return paths


PARAMS = {
    "seed": 1,
    "default_effort": "medium",
    "untagged_fraction": 0.5,
    "effort_tag": "{reasoning effort: $effort}",
}


def test_dataset_keeps_the_shortest_correct_trace_and_tags_efforts(tmp_path):
    paths = _graded(tmp_path)
    out = str(tmp_path / "train.jsonl")
    m = dataset.build(graded=paths, out_dataset=out, params=PARAMS, log=lambda _: None)
    rows = read_jsonl(out)
    graded = [r for p in paths.values() for r in read_jsonl(p)]
    for row in rows:
        candidates = [
            g
            for g in graded
            if g["prompt_id"] == row["prompt_id"]
            and g["effort"] == row["effort"]
            and g["grade"]["correct"]
        ]
        assert row["completion_tokens"] == min(c["completion_tokens"] for c in candidates)
        assert row["messages"][-1]["role"] == "assistant" and row["id"] in {
            c["key"] for c in candidates
        }
        if row["tagged"]:
            assert row["messages"][0] == {
                "role": "system",
                "content": f"{{reasoning effort: {row['effort']}}}",
            }
        else:
            assert row["effort"] == "medium" and row["messages"][0]["role"] == "user"
    medium = [r for r in rows if r["effort"] == "medium"]
    assert 0.3 < sum(not r["tagged"] for r in medium) / len(medium) < 0.7
    assert all(r["tagged"] for r in rows if r["effort"] == "low")
    solvable = {(g["prompt_id"], g["effort"]) for g in graded if g["grade"]["correct"]}
    assert len(rows) == len(solvable) == m["examples"]


def test_dataset_with_nothing_correct_fails_clearly(tmp_path):
    path = tmp_path / "g.jsonl"
    write_jsonl(
        path,
        [
            {
                "key": "k",
                "prompt_id": "p",
                "effort": "low",
                "sample_index": 0,
                "prompt": "q",
                "response": "r",
                "completion_tokens": 1,
                "grade": {"correct": False},
            }
        ],
    )
    with pytest.raises(DataError, match="no correct samples"):
        dataset.build(graded={"g": str(path)}, out_dataset=str(tmp_path / "o.jsonl"), params=PARAMS)
    path.write_text('{"key": "k"}\n')
    with pytest.raises(DataError, match=r"g.jsonl:1: missing key 'prompt_id'"):
        dataset.build(graded={"g": str(path)}, out_dataset=str(tmp_path / "o.jsonl"), params=PARAMS)
