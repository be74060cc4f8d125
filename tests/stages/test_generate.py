"""The generation stage: one record per sample key, resumed after a torn write."""

import json

from stillroom.data import sources
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages import generate

SPEC = {"backend": "procedural", "error_rate": {"low": 0.4, "medium": 0.2}}
PARAMS = {"teacher": "proc", "spec": SPEC, "effort": "low", "samples": 2, "seed": 5}


def _shard(tmp_path, n=40):
    path = tmp_path / "shard.jsonl"
    write_jsonl(
        path,
        sources.generate("arithmetic", "a", n, 1, max_operand=12)
        + sources.generate("choice", "c", n // 2, 1, max_operand=12),
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
    # each trace names the teacher that wrote it (generation.effort_teachers may differ per effort)
    assert all(r["teacher"] == "proc" and "/proc/low/" in r["key"] for r in rows)
    assert all(r["finish_reason"] == "stop" and r["response"].startswith("<think>") for r in rows)
    assert not (tmp_path / "gen.jsonl.partial").exists()


def test_generation_resumes_after_a_torn_write(tmp_path):
    shard, out = _shard(tmp_path), str(tmp_path / "gen.jsonl")
    _generate(shard, out)
    full = read_jsonl(out)
    # A killed run: its fingerprint, 7 complete records and half of the 8th, and no final file.
    partial = tmp_path / "gen.jsonl.partial"
    params = generate.Params.parse(PARAMS)
    lines = [json.dumps({"fingerprint": {**generate.fingerprint(params), "effort": "low"}})]
    lines += [json.dumps(r, sort_keys=True) for r in full[:7]]
    torn = json.dumps(full[7])
    partial.write_text("\n".join(lines) + "\n" + torn[: len(torn) // 2])
    (tmp_path / "gen.jsonl").unlink()
    logs = []
    generate.run(
        shard=shard,
        out_samples=out,
        log=logs.append,
        params=PARAMS,
    )
    resumed = read_jsonl(out)
    assert [r["key"] for r in resumed] == [r["key"] for r in full]
    assert [r["response"] for r in resumed] == [r["response"] for r in full]
    assert any("torn" in line for line in logs) and any(
        "7 samples already done" in line for line in logs
    )


def test_a_partial_shard_of_other_sampling_is_started_over_and_of_other_operations_resumed(
    tmp_path,
):
    """A shard killed and rerun after its teacher's settings changed: what it writes changed
    (error rate, seed) -> started over; only how it is reached (concurrency, retries) -> resumed."""
    shard, out = _shard(tmp_path, 10), str(tmp_path / "gen.jsonl")
    _generate(shard, out)
    full = read_jsonl(out)
    partial = tmp_path / "gen.jsonl.partial"

    def killed(params):
        fp = {**generate.fingerprint(generate.Params.parse(params)), "effort": "low"}
        lines = [json.dumps({"fingerprint": fp})] + [json.dumps(r) for r in full[:5]]
        partial.write_text("\n".join(lines) + "\n")
        (tmp_path / "gen.jsonl").unlink(missing_ok=True)

    for changed, resumed in [
        ({"spec": {**SPEC, "concurrency": 8, "max_failed_fraction": 0.5}}, True),
        ({"spec": {**SPEC, "error_rate": 0.0}}, False),
        ({"seed": 6}, False),
    ]:
        killed(PARAMS)
        logs = []
        generate.run(shard=shard, out_samples=out, log=logs.append, params={**PARAMS, **changed})
        assert any("5 samples already done" in line for line in logs) == resumed, changed
        assert any("starting over" in line for line in logs) != resumed
