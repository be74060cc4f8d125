"""Daily output-token budget shared by shard jobs, and the context-length guard."""

import json
import multiprocessing
import os
from datetime import UTC, datetime

import pytest

from stillroom.config import ConfigError
from stillroom.data import sources
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages import generate
from stillroom.teachers import SkipSample, make_teacher
from stillroom.teachers.budget import Budget, BudgetExhausted

from ..fault_server import FaultServer

SPEC = {
    "backend": "openai",
    "model": "m",
    "backoff_base_s": 0.01,
    "timeout_s": 5,
    "concurrency": 4,
    "sampling": {"max_tokens": 40},
}


def _shard(tmp_path, name="shard", n=20, seed=1):
    path = tmp_path / f"{name}.jsonl"
    write_jsonl(path, sources.generate("arithmetic", name, n, seed, max_operand=12))
    return str(path)


def _run(shard, out, spec, k=1):
    return generate.run(
        shard=shard,
        out_samples=out,
        log=lambda _: None,
        params={"teacher": "api", "spec": spec, "effort": "low", "samples": k, "seed": 0},
    )


def test_budget_day_and_reservations(tmp_path):
    b = Budget(tmp_path / "ledger.json", daily_tokens=100, reset_hour_utc=6)
    assert b._period(datetime(2026, 11, 29, 5, tzinfo=UTC))[0] == "2026-11-28"
    day, ends = b._period(datetime(2026, 11, 29, 7, tzinfo=UTC))
    assert day == "2026-11-29" and ends == datetime(2026, 11, 30, 6, tzinfo=UTC)
    assert b.reserve(60) and not b.reserve(41) and b.reserve(40)
    b.settle(60, 7)
    b.settle(40, 3)
    st = b.status()
    assert (st["spent"], st["in_flight"]) == (10, 0) and b.reserve(90) and not b.reserve(1)
    ledger = json.loads((tmp_path / "ledger.json").read_text())
    ledger["day"] = "2000-01-01"  # a new day starts from zero
    (tmp_path / "ledger.json").write_text(json.dumps(ledger))
    assert b.status()["spent"] == 0 and b.reserve(100)


def test_reservations_of_dead_processes_are_released(tmp_path):
    ledger = tmp_path / "ledger.json"
    b = Budget(ledger, daily_tokens=100)
    b.reserve(10)
    state = json.loads(ledger.read_text())
    import socket

    state["reserved"][f"{socket.gethostname()}:999999"] = 80  # a job that was SIGKILLed mid-request
    ledger.write_text(json.dumps(state))
    assert b.status()["in_flight"] == 10


def test_exhaustion_stops_cleanly_and_the_next_run_resumes(tmp_path):
    shard, out = _shard(tmp_path), str(tmp_path / "gen.jsonl")
    ledger = tmp_path / "budget" / "api.json"
    spec = {**SPEC, "budget": {"daily_output_tokens": 200, "ledger": str(ledger)}}
    with FaultServer() as server:
        spec["base_url"] = server.base_url
        with pytest.raises(
            BudgetExhausted, match=r"budget reached \(\d+ of 200 spent.*resets at .*remain; rerun"
        ):
            _run(shard, out, spec)
        kept = read_jsonl(out + ".partial")[1:]  # after the fingerprint line
        state = json.loads(ledger.read_text())
        assert (
            0 < len(kept) < 20
            and state["spent"] == sum(r["completion_tokens"] for r in kept) <= 200
        )
        assert state["reserved"] == {} and not (tmp_path / "gen.jsonl").exists()
        spec["budget"]["daily_output_tokens"] = 10_000  # the next day, in effect
        m = _run(shard, out, spec)
    rows = read_jsonl(out)
    assert len(rows) == len({r["key"] for r in rows}) == 20 and m["failed"] == 0
    assert json.loads(ledger.read_text())["spent"] == sum(r["completion_tokens"] for r in rows)


def _job(args):
    shard, out, spec = args
    try:
        _run(shard, out, spec)
    except BudgetExhausted:
        pass
    return out


def test_concurrent_jobs_share_one_ledger_exactly(tmp_path):
    ledger = tmp_path / "api.json"
    with FaultServer() as server:
        spec = {
            **SPEC,
            "base_url": server.base_url,
            "budget": {"daily_output_tokens": 500, "ledger": str(ledger)},
        }
        jobs = [
            (_shard(tmp_path, f"s{i}", 80, i), str(tmp_path / f"gen{i}.jsonl"), spec)
            for i in range(2)
        ]
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            outs = pool.map(_job, jobs)
    written = [o if os.path.exists(o) else o + ".partial" for o in outs]  # finished or stopped
    tokens = sum(
        r.get("completion_tokens", 0) for o in written for r in read_jsonl(o)
    )  # a partial file opens with its fingerprint line
    state = json.loads(ledger.read_text())
    # Never over the limit; admission stops once the worst case of the 8 requests in flight might
    # not fit.
    assert (
        state["spent"] == tokens
        and 500 - (2 * 4 + 1) * 40 < tokens <= 500
        and state["reserved"] == {}
    )


def test_context_guard_clamps_or_skips(tmp_path):
    problem = {"prompt_id": "p", "prompt": "word " * 300}
    clamp = make_teacher("api", {**SPEC, "base_url": "http://x/v1", "context_length": 530})
    body = clamp.guard_context(clamp.request_body(problem, "low", 0, 0))
    prompt_tokens = clamp.count_prompt_tokens(body)
    assert (
        prompt_tokens >= 1500 // 3
        and body["max_tokens"] == 530 - prompt_tokens
        and body["max_tokens_clamped_from"] == 40
    )
    skip = make_teacher(
        "api", {**SPEC, "base_url": "http://x/v1", "context_length": 530, "on_overflow": "skip"}
    )
    with pytest.raises(SkipSample, match="exceeds context_length 530"):
        skip.guard_context(skip.request_body(problem, "low", 0, 0))
    short = {"prompt_id": "q", "prompt": "What is 1 + 1?"}
    assert "max_tokens_clamped_from" not in skip.guard_context(
        skip.request_body(short, "low", 0, 0)
    )


def test_skipped_samples_are_recorded_with_the_reason(tmp_path):
    path = tmp_path / "shard.jsonl"
    rows = sources.generate("arithmetic", "a", 4, 1, max_operand=12)
    rows[0]["prompt"] = "long " * 400
    write_jsonl(path, rows)
    with FaultServer() as server:
        m = _run(
            str(path),
            str(tmp_path / "gen.jsonl"),
            {**SPEC, "base_url": server.base_url, "context_length": 300, "on_overflow": "skip"},
        )
    out = {r["prompt_id"]: r for r in read_jsonl(tmp_path / "gen.jsonl")}
    assert m["skipped"] == 1 and out[rows[0]["prompt_id"]]["skipped"].startswith("prompt")
    assert out[rows[0]["prompt_id"]]["response"] is None and server.counts["requests"] == 3


def test_a_budget_needs_max_tokens():
    with pytest.raises(ConfigError, match="teachers.api.budget: needs sampling.max_tokens"):
        make_teacher(
            "api",
            {
                **SPEC,
                "base_url": "http://x/v1",
                "sampling": {},
                "budget": {"daily_output_tokens": 5},
            },
        )
