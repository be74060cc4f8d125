"""The dataset stage: the shortest correct trace per (prompt, effort), effort-tagged; kernel rows
are instruction, reasoning and code."""

import pytest

from stillroom.grading.formats import extract_code, kernel_instruction
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.stages import dataset, grade
from stillroom.teachers.procedural import ProceduralTeacher

from ..conftest import kernel_records
from .test_generate import _generate, _shard


def _graded(tmp_path):
    shard, paths = _shard(tmp_path, 60), {}
    for effort in ("low", "medium"):
        gen, graded = (
            str(tmp_path / f"gen-{effort}.jsonl"),
            str(tmp_path / f"graded-{effort}.jsonl"),
        )
        _generate(shard, gen, effort, k=3)
        grade.run(samples=gen, out_graded=graded, params={}, log=lambda _: None)
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


def test_dataset_rows_are_instruction_reasoning_code(tmp_path):
    rec = kernel_records(["relu"])[0]
    text = ProceduralTeacher("p", {"backend": "procedural"}).complete(rec, "medium", 0, 1).text
    graded = {
        **rec,
        "key": "k",
        "effort": "medium",
        "sample_index": 0,
        "response": text,
        "completion_tokens": 9,
        "grade": {"correct": True},
    }
    write_jsonl(tmp_path / "g.jsonl", [graded])
    dataset.build(
        graded={"a": str(tmp_path / "g.jsonl")},
        out_dataset=str(tmp_path / "d.jsonl"),
        params={
            "seed": 0,
            "default_effort": "high",
            "untagged_fraction": 0.0,
            "effort_tag": "[$effort]",
        },
        log=lambda _: None,
    )
    messages = read_jsonl(tmp_path / "d.jsonl")[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[1]["content"] == kernel_instruction(rec["prompt"])
    assert messages[2]["content"].startswith("<think>") and extract_code(messages[2]["content"])
