"""The generation stage: one record per sample key, resumed after a torn write or a write cut
before its newline, and never resumed from records of other settings or another problem."""

import json

import pytest

from stillroom.config import Experiment, merge_configs, resolve
from stillroom.data import sources
from stillroom.io import DataError, read_jsonl, write_jsonl
from stillroom.plan.dag import Plan
from stillroom.stages import generate, grade

from ..conftest import REPO, default_config

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


# what differs between two runs that wrote the same samples
VOLATILE = ("created_at", "latency_s")


def _content(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


def test_a_partial_of_other_settings_is_set_aside_never_mixed(tmp_path):
    """The issue's case: a 3-sample run (another error rate) left its partial, then a 1-sample run
    starts. Its shard equals a fresh 1-sample run's; the old records are kept aside, and the warning
    names the file and the settings that differ. An old-format partial (no fingerprint) too."""
    shard = _shard(tmp_path, 20)
    fresh = str(tmp_path / "fresh.jsonl")
    _generate(shard, fresh, k=1)
    old = {**PARAMS, "samples": 3, "spec": {**SPEC, "error_rate": {"low": 0.9}}}
    other = str(tmp_path / "other.jsonl")
    generate.run(shard=shard, out_samples=other, log=lambda _: None, params=old)
    fp = {**generate.fingerprint(generate.Params.parse(old)), "effort": "low"}
    body = (tmp_path / "other.jsonl").read_text()
    partial = tmp_path / "gen.jsonl.partial"
    for head, why in [(json.dumps({"fingerprint": fp}) + "\n", "other settings"), ("", "no fing")]:
        partial.write_text(head + body)
        logs = []
        m = generate.run(
            shard=shard,
            out_samples=str(tmp_path / "gen.jsonl"),
            log=logs.append,
            params={**PARAMS, "samples": 1},
        )
        assert m["samples"] == 30
        assert _content(read_jsonl(tmp_path / "gen.jsonl")) == _content(read_jsonl(fresh))
        warning = next(line for line in logs if line.startswith("warning:"))
        assert str(partial) in warning and why in warning, warning
        if head:
            assert "samples: 3 -> 1" in warning and "spec.error_rate.low: 0.9 -> 0.4" in warning
        assert not any("already done" in line for line in logs)
        stale = sorted(tmp_path.glob("gen.jsonl.partial.stale-*"))
        assert stale and stale[-1].read_text() == head + body
        (tmp_path / "gen.jsonl").unlink()


def test_records_of_a_changed_problem_are_redone(tmp_path):
    """Same prompt id, corrected answer: the resumed shard carries the new answer everywhere."""
    shard = _shard(tmp_path, 10)
    out = str(tmp_path / "gen.jsonl")
    _generate(shard, out)
    full = read_jsonl(out)
    params = generate.Params.parse(PARAMS)
    lines = [json.dumps({"fingerprint": {**generate.fingerprint(params), "effort": "low"}})]
    (tmp_path / "gen.jsonl.partial").write_text(
        "\n".join(lines + [json.dumps(r) for r in full]) + "\n"
    )
    problems = read_jsonl(shard)
    problems[0]["answer"] = corrected = str(int(problems[0]["answer"]) + 100)
    write_jsonl(shard, problems)
    logs = []
    generate.run(shard=shard, out_samples=out, log=logs.append, params=PARAMS)
    assert f"{len(full) - 2} samples already done" in " ".join(logs)
    redone = [r for r in read_jsonl(out) if r["prompt_id"] == problems[0]["prompt_id"]]
    assert len(redone) == 2 and all(r["answer"] == corrected for r in redone)


def test_killed_twice_after_a_write_cut_before_its_newline_resumes_to_an_uninterrupted_shard(
    tmp_path,
):
    """A kill leaves the last record without its newline; the resume repairs it, is killed again,
    and the next resume finishes: the shard equals an uninterrupted one."""
    import signal
    import subprocess
    import sys
    import time

    from ..fault_server import FaultServer

    shard = _shard(tmp_path, 30)
    with FaultServer(delay_s=0.01) as server:
        spec = {"backend": "openai", "model": "m", "base_url": server.base_url, "concurrency": 2}
        params = {"teacher": "api", "effort": "low", "samples": 2, "seed": 3, "spec": spec}
        reference = tmp_path / "reference.jsonl"
        generate.run(shard=shard, out_samples=str(reference), params=params, log=lambda _: None)
        out, partial = tmp_path / "killed.jsonl", tmp_path / "killed.jsonl.partial"
        cmd = [sys.executable, "-m", "stillroom", "generate", "--shard", shard]
        cmd += ["--out-samples", str(out), "--params", json.dumps(params)]
        errs = []
        for threshold in (20, 50, None):
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            while threshold and proc.poll() is None:
                if partial.exists() and partial.read_bytes().count(b"\n") >= threshold:
                    proc.send_signal(signal.SIGKILL)
                    break
                time.sleep(0.002)
            errs.append(proc.communicate(timeout=120)[1].decode())
            if threshold:
                assert proc.returncode == -signal.SIGKILL and not out.exists()
            if threshold == 20:
                # the write was cut just before the last record's newline
                partial.write_bytes(partial.read_bytes().rstrip(b"\n"))
    assert proc.returncode == 0, errs[-1][-2000:]
    assert "the last record lacked its newline; added it" in errs[1]
    assert "resuming: " in errs[2]
    assert _content(read_jsonl(out)) == _content(read_jsonl(reference))
    assert not partial.exists()


def test_a_generation_job_s_params_name_its_effort_or_its_group_s_efforts():
    groups = {"generation": {"effort_groups": [["low", "high"]]}}
    config = resolve(merge_configs(default_config(), groups), REPO)
    exp = Experiment.parse(config)
    plan = Plan(exp, config, REPO)
    teacher = exp.generation.teacher
    # one effort a job: its {efforts} key is the effort, and no efforts key
    one = json.loads(
        generate.job_params(exp, teacher, plan.job_efforts(teacher, "medium")).as_param()
    )
    assert one == {
        "seed": exp.seed,
        "teacher": teacher,
        "spec": exp.teachers[teacher].dump(),
        "samples": exp.generation.samples_per_prompt,
        "effort": "medium",
    }
    # a group: its efforts in order, one job for all
    group = plan.job_efforts(teacher, "low+high")
    both = json.loads(generate.job_params(exp, teacher, group).as_param())
    assert both == {**{k: v for k, v in one.items() if k != "effort"}, "efforts": ["low", "high"]}
    with pytest.raises(ValueError, match="low\\+high is generated by teacher"):
        plan.job_efforts("another", "low+high")


def test_an_effort_group_s_job_writes_one_file_and_grading_takes_one_effort_of_it(tmp_path):
    shard = _shard(tmp_path, 10)
    group = str(tmp_path / "low+medium.jsonl")
    params = {**PARAMS, "effort": None, "efforts": ["low", "medium"]}
    m = generate.run(shard=shard, out_samples=group, log=lambda _: None, params=params)
    rows = read_jsonl(group)
    # each effort's records together, in the group's order, as its job alone writes them
    medium = [r for r in rows if r["effort"] == "medium"]
    assert [r["effort"] for r in rows] == ["low"] * (len(rows) - len(medium)) + ["medium"] * len(
        medium
    )
    alone = str(tmp_path / "medium.jsonl")
    _generate(shard, alone, effort="medium")
    assert _content(medium) == _content(read_jsonl(alone))
    assert m["samples"] == len(rows) and set(m["per_effort"]) == {"low", "medium"}
    # a killed group job resumes from its one partial file: what it had is kept, the rest redone
    fingerprint = {
        **generate.fingerprint(generate.Params.parse(params)),
        "efforts": params["efforts"],
    }
    kept = rows[: len(rows) // 2 + 1]  # all of low and a first medium record
    write_jsonl(f"{group}.partial", [{"fingerprint": fingerprint}, *kept])
    logged = []
    generate.run(shard=shard, out_samples=group, log=logged.append, params=params)
    assert f"resuming: {len(kept)} samples already done" in logged
    assert read_jsonl(group)[: len(kept)] == kept and _content(read_jsonl(group)) == _content(rows)
    graded = str(tmp_path / "graded.jsonl")
    g = grade.run(samples=group, out_graded=graded, params={"effort": "medium"}, log=lambda _: None)
    assert [r["key"] for r in read_jsonl(graded)] == [r["key"] for r in medium]
    assert g["samples"] == len(medium)
    with pytest.raises(DataError, match="no records of effort high"):
        grade.run(samples=group, out_graded=graded, params={"effort": "high"}, log=lambda _: None)
