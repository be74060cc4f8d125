"""The openai backend and the concurrent generation driver against a fault-injection server."""

import asyncio
import json
import re
import time
from datetime import UTC

import pytest

from stillroom.config import ConfigError
from stillroom.data import sources
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages import generate
from stillroom.teachers import TeacherError, make_teacher

from ..fault_server import FaultServer

FAST = {
    "backend": "openai",
    "model": "m",
    "backoff_base_s": 0.01,
    "backoff_max_s": 0.05,
    "timeout_s": 0.5,
    "max_attempts": 40,
    "concurrency": 8,
    "sampling": {"temperature": 0.7, "top_p": 0.99, "max_tokens": 64},
}


def _problems(tmp_path, n=30):
    path = tmp_path / "shard.jsonl"
    write_jsonl(path, sources.generate("arithmetic", "a", n, 1, max_operand=12))
    return str(path)


def _run(shard, out, spec, k=2):
    return generate.run(
        shard=shard,
        out_samples=out,
        log=lambda _: None,
        params={"teacher": "api", "spec": spec, "effort": "medium", "samples": k, "seed": 3},
    )


def test_request_body_carries_sampling_and_effort():
    problem = {"prompt_id": "p", "prompt": "What is 2 + 3?"}
    t = make_teacher("api", {**FAST, "base_url": "http://x/v1"})
    body = t.request_body(problem, "high", 1, 3)
    assert (
        body["reasoning_effort"] == "high"
        and body["temperature"] == 0.7
        and body["max_tokens"] == 64
    )
    assert body["messages"] == [{"role": "user", "content": "What is 2 + 3?"}]
    assert body["seed"] != t.request_body(problem, "high", 0, 3)["seed"]
    t = make_teacher(
        "api",
        {
            **FAST,
            "base_url": "http://x/v1",
            "endpoint": "completions",
            "effort": {
                "system": "Reasoning: $effort",
                "extra_body": {"chat_template_kwargs": "e=$effort"},
            },
        },
    )
    body = t.request_body(problem, "low", 0, 3)
    assert (
        body["prompt"] == "Reasoning: low\n\nWhat is 2 + 3?"
        and body["chat_template_kwargs"] == "e=low"
    )
    assert "reasoning_effort" not in body
    with pytest.raises(ConfigError, match="teachers.api.base_url: required key missing"):
        make_teacher("api", {"backend": "openai", "model": "m"})


def test_server_reasoning_field_becomes_a_think_block():
    t = make_teacher("api", {**FAST, "base_url": "http://x/v1"})
    c = t._parse(
        {
            "model": "served",
            "choices": [
                {
                    "finish_reason": "length",
                    "message": {"content": " The answer is 5.", "reasoning_content": "2 + 3 = 5"},
                }
            ],
            "usage": {"completion_tokens": 9},
        },
        {},
        2,
    )
    assert c.text == "<think>2 + 3 = 5</think>\nThe answer is 5." and c.reasoning == "2 + 3 = 5"
    assert (c.finish_reason, c.completion_tokens, c.model, c.extra["attempts"]) == (
        "length",
        9,
        "served",
        2,
    )


def test_every_sample_survives_injected_faults(tmp_path):
    rates = {"error500": 0.1, "rate429": 0.1, "malformed": 0.1, "reset": 0.1, "slow": 0.05}
    with FaultServer(rates, seed=1, slow_s=1.0) as server:
        out = str(tmp_path / "gen.jsonl")
        ledger = tmp_path / "ledger.json"
        m = _run(
            _problems(tmp_path),
            out,
            {
                **FAST,
                "base_url": server.base_url,
                "price": {"input_per_mtok": 1.0, "output_per_mtok": 4.0},
                "budget": {"daily_output_tokens": 10**9, "ledger": str(ledger)},
            },
        )
    rows = read_jsonl(out)
    assert len(rows) == len({r["key"] for r in rows}) == 60 and m["failed"] == 0
    for r in rows:  # the fault server answers with the sum of the prompt's numbers
        assert r["error"] is None and r["response"].endswith(
            f"\\boxed{{{sum(map(int, re.findall(r'[0-9]+', r['prompt'])))}}}."
        )
    assert all(v > 0 for k, v in server.counts.items() if k != "slow") and server.counts["ok"] == 60
    # Every request the server saw was an attempt the client counted (an attempt on a pooled
    # connection
    # the server had already dropped never reaches the handler, so the client may count a few more).
    assert server.counts["requests"] <= sum(r["attempts"] for r in rows) == m["attempts"]
    assert {r["model"] for r in rows} == {"m-served"} and rows[0]["sampling"]["top_p"] == 0.99
    state = json.loads(ledger.read_text())  # the budget ledger is exact under faults
    assert state["spent"] == sum(r["completion_tokens"] for r in rows) and state["reserved"] == {}
    assert state["requests"] == 60
    assert m["cost_usd"] == pytest.approx(
        (m["prompt_tokens"] * 1.0 + m["completion_tokens"] * 4.0) / 1e6
    )


def test_retry_after_header_forms():
    from datetime import datetime, timedelta
    from email.utils import format_datetime

    from stillroom.teachers.openai import _retry_after

    assert (
        _retry_after("2.5") == 2.5 and _retry_after(None) is None and _retry_after("soon") is None
    )
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < _retry_after(later) <= 30


def test_retry_after_is_honoured():
    with FaultServer({"rate429": 1.0}, retry_after="0.4") as server:
        t = make_teacher("api", {**FAST, "base_url": server.base_url, "max_attempts": 3})
        start = time.monotonic()
        with pytest.raises(TeacherError, match="gave up after 3 attempts; last: HTTP 429") as err:

            async def once():
                try:
                    await t.acomplete({"prompt_id": "p", "prompt": "1 + 1"}, "low", 0, 0)
                finally:
                    await t.aclose()

            asyncio.run(once())
        assert (
            time.monotonic() - start >= 0.8
            and err.value.attempts == 3
            and server.counts["requests"] == 3
        )


def test_failures_are_recorded_then_retried_on_the_next_run(tmp_path):
    shard, out = _problems(tmp_path, 10), str(tmp_path / "gen.jsonl")
    with FaultServer({"error500": 1.0}) as server:
        with pytest.raises(TeacherError, match="20 of 20 samples failed for good"):
            _run(shard, out, {**FAST, "base_url": server.base_url, "max_attempts": 2})
    kept = read_jsonl(out + ".partial")[1:]  # after the fingerprint line
    assert len(kept) == 20 and all(r["error"].startswith("gave up after 2 attempts") for r in kept)
    assert not (tmp_path / "gen.jsonl").exists()
    with FaultServer() as healthy:
        m = _run(shard, out, {**FAST, "base_url": healthy.base_url})
    assert m["failed"] == 0 and healthy.counts["requests"] == 20
    assert all(r["error"] is None for r in read_jsonl(out))


def test_api_key_comes_from_the_named_environment_variable(monkeypatch):
    t = make_teacher(
        "api", {**FAST, "base_url": "http://x/v1", "api_key_env": "STILLROOM_TEST_KEY"}
    )
    monkeypatch.delenv("STILLROOM_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="STILLROOM_TEST_KEY"):
        t._headers()
    monkeypatch.setenv("STILLROOM_TEST_KEY", "sk-1")
    assert t._headers() == {"Authorization": "Bearer sk-1"}


@pytest.mark.slow
def test_snakemake_generates_a_shard_from_an_openai_teacher(tmp_path, small_cfg):
    from ..conftest import run_snakemake

    with FaultServer({"error500": 0.2, "rate429": 0.1}) as server:
        small_cfg["teachers"]["api"] = {
            k: v for k, v in {**FAST, "base_url": server.base_url}.items()
        }
        small_cfg["generation"]["teacher"] = "api"
        run_snakemake(tmp_path, small_cfg, "results/small/gen/api/low/shard-00000.jsonl")
    rows = read_jsonl(tmp_path / "results" / "small" / "gen" / "api" / "low" / "shard-00000.jsonl")
    assert rows and all(
        r["error"] is None and r["teacher"] == "api" and r["effort"] == "low" for r in rows
    )
    assert sum(r["attempts"] for r in rows) >= server.counts["requests"] > len(rows)


def test_sigkill_at_random_points_loses_and_duplicates_nothing(tmp_path):
    """Kill the real CLI process with SIGKILL several times mid-shard; each rerun resumes."""
    import random
    import signal
    import subprocess
    import sys

    shard = _problems(tmp_path, 60)
    with FaultServer({"error500": 0.05}, delay_s=0.01) as server:
        params = {
            "teacher": "api",
            "effort": "low",
            "samples": 2,
            "seed": 3,
            "spec": {**FAST, "base_url": server.base_url, "concurrency": 4},
        }
        reference = str(tmp_path / "reference.jsonl")
        generate.run(shard=shard, out_samples=reference, params=params, log=lambda _: None)
        out = tmp_path / "killed.jsonl"
        cmd = [
            sys.executable,
            "-m",
            "stillroom",
            "generate",
            "--shard",
            shard,
            "--out-samples",
            str(out),
            "--params",
            json.dumps(params),
        ]
        partial = tmp_path / "killed.jsonl.partial"
        kills = 0
        for threshold in sorted(random.Random(7).sample(range(10, 110), 3)) + [None]:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while threshold and proc.poll() is None:  # kill once `threshold` records are on disk
                if partial.exists() and partial.read_bytes().count(b"\n") >= threshold:
                    proc.send_signal(signal.SIGKILL)
                    kills += 1
                    break
                time.sleep(0.002)
            proc.wait(timeout=120)
            if threshold is None:
                assert proc.returncode == 0
    rows = read_jsonl(out)
    assert kills == 3
    assert sorted(r["key"] for r in rows) == sorted(r["key"] for r in read_jsonl(reference))
    assert len({r["key"] for r in rows}) == len(rows) == 120
