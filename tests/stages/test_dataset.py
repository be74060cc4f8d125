"""The dataset stage: the shortest correct trace per (prompt, effort), effort-tagged; kernel rows
are instruction, reasoning and code."""

import json

import pytest

from stillroom.config import Experiment, ValidatorOptions, merge_configs
from stillroom.grading.formats import extract_code, kernel_instruction
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.stages import dataset, grade
from stillroom.teachers.procedural import ProceduralTeacher

from ..conftest import default_config, kernel_records
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


def _slots(graded, correct_only=True):
    slots = {}
    for g in graded:
        if g["grade"]["correct"] or not correct_only:
            slots.setdefault((g["prompt_id"], g["effort"]), []).append(g)
    return slots


def _synthetic(tmp_path, prompts=20, k=4):
    """Graded traces of different lengths per (prompt, effort), the last one wrong."""
    rows = [
        {
            "key": f"p{p}-{i}",
            "prompt_id": f"p{p}",
            "effort": "medium",
            "sample_index": i,
            "prompt": f"q{p}",
            "response": f"r{p}-{i}",
            "completion_tokens": 10 + (7 * p + 5 * i) % 13,
            "grade": {"correct": i < k - 1},
        }
        for p in range(prompts)
        for i in range(k)
    ]
    write_jsonl(tmp_path / "g.jsonl", rows)
    return {"g": str(tmp_path / "g.jsonl")}, rows


@pytest.mark.parametrize("select", ["shortest", "longest", "random"])
def test_one_trace_per_slot_selections(tmp_path, select):
    paths, graded = _synthetic(tmp_path)
    slots = _slots(graded)
    outs = []
    for run in (1, 2):
        out = str(tmp_path / f"{select}-{run}.jsonl")
        m = dataset.build(
            graded=paths, out_dataset=out, params={**PARAMS, "select": select}, log=lambda _: None
        )
        outs.append(read_jsonl(out))
    assert outs[0] == outs[1] and m["select"] == select  # reproducible
    rows = outs[0]
    assert len(rows) == len(slots) == m["examples_correct"] == m["examples"]
    picked = []
    for row in rows:
        slot = slots[(row["prompt_id"], row["effort"])]
        assert row["id"] in {c["key"] for c in slot}
        tokens = [c["completion_tokens"] for c in slot]
        picked.append((row["completion_tokens"], min(tokens), max(tokens)))
    if select == "shortest":
        assert all(t == lo for t, lo, _ in picked)
    elif select == "longest":
        assert all(t == hi for t, _, hi in picked)
    else:  # neither always the shortest nor always the longest
        assert any(t != lo for t, lo, _ in picked) and any(t != hi for t, _, hi in picked)
    other_seed = str(tmp_path / "seed.jsonl")
    dataset.build(
        graded=paths, out_dataset=other_seed, params={**PARAMS, "select": select, "seed": 2}
    )
    changed = [r["id"] for r in read_jsonl(other_seed)] != [r["id"] for r in rows]
    assert changed == (select == "random")


def test_all_and_unfiltered_keep_every_trace_they_select(tmp_path):
    paths, graded = _synthetic(tmp_path)
    for select, keys in (
        ("all", {g["key"] for g in graded if g["grade"]["correct"]}),
        ("unfiltered", {g["key"] for g in graded}),
    ):
        out = str(tmp_path / f"{select}.jsonl")
        m = dataset.build(
            graded=paths, out_dataset=out, params={**PARAMS, "select": select}, log=lambda _: None
        )
        rows = read_jsonl(out)
        assert {r["id"] for r in rows} == keys and len(rows) == len(keys) == m["examples"]
        correct = sum(g["grade"]["correct"] for g in graded if g["key"] in keys)
        assert m["examples_correct"] == correct
    assert correct < len(graded)  # unfiltered really took wrong traces


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


def test_a_dataset_job_s_params_name_its_selection_not_the_ablation():
    exp = Experiment.parse(merge_configs(default_config(), {"dataset": {"ablation": ["longest"]}}))
    job = json.loads(dataset.job_params(exp).as_param())
    assert job["select"] == exp.dataset.select and job["effort_tag"] == exp.student.effort_tag
    # another selection is another job: the list never reaches this one's params
    assert "ablation" not in job
    # no sft_sources: neither they nor the reward that would grade them
    assert "sft_sources" not in job and "kernel" not in job
    assert json.loads(dataset.job_params(exp, "longest").as_param()) == {**job, "select": "longest"}


def test_sft_sources_bring_the_kernel_validator_s_options_into_a_dataset_job():
    source = {"name": "kb", "kind": "kernelbook", "path": "org/kb", "revision": "a" * 40}
    config = merge_configs(default_config(), {"dataset": {"sft_sources": [source]}})
    exp = Experiment.parse(config)
    job = json.loads(dataset.job_params(exp).as_param())
    assert job["sft_sources"][0]["path"] == "org/kb"
    # no kernels section: the validator's defaults, written as none given
    assert job["kernel"] == {} and dataset.job_params(exp).kernel == ValidatorOptions()
