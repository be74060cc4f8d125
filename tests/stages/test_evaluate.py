"""The evaluate stage: k answers per problem, long answers continued from their exact tokens and
budget-forced answers recorded, in process and through a real served model."""

import json

import pytest

from stillroom.config import Experiment, Forcing
from stillroom.io import read_jsonl, write_jsonl
from stillroom.stages import evaluate

from ..conftest import default_config


@pytest.mark.slow
def test_evaluate_stage_records_segments_and_forced_answers(setup, tmp_path):
    from stillroom.cli import main

    write_jsonl(
        tmp_path / "bench.jsonl",
        [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "kind": "math"} for i in range(3)],
    )
    common = {
        "model_name": "base",
        "benchmark": "b",
        "samples": 2,
        "temperature": 0.7,
        "top_p": 0.95,
        "batch_size": 6,
        "effort": None,
        "effort_tag": "{reasoning effort: $effort}",
        "seed": 3,
    }
    args = ["evaluate", "--model", str(setup / "base"), "--problems", str(tmp_path / "bench.jsonl")]
    long = {**common, "max_new_tokens": 24, "request_tokens": 8}
    assert (
        main([*args, "--out-samples", str(tmp_path / "long.jsonl"), "--params", json.dumps(long)])
        == 0
    )
    rows = read_jsonl(tmp_path / "long.jsonl")
    assert len(rows) == 6 and all(r["completion_tokens"] <= 24 for r in rows)
    assert any(len(r.get("segments", [])) == 3 for r in rows)  # a random model runs to the limit
    forced = {**common, "max_new_tokens": 24, "budget": 8, "answer_tokens": 4}
    assert (
        main(
            [*args, "--out-samples", str(tmp_path / "forced.jsonl"), "--params", json.dumps(forced)]
        )
        == 0
    )
    rows = read_jsonl(tmp_path / "forced.jsonl")
    assert all(r["budget"] == 8 and r["forced"] and r["thinking_tokens"] == 8 for r in rows)


@pytest.mark.slow
def test_evaluation_through_a_real_served_model(setup, tmp_path):
    """The sglang backend's lifecycle with a real OpenAI-compatible server (`transformers serve`)
    for the checkpoint under evaluation: raw completions, continued while cut off, and
    budget-forced."""
    import sys
    from pathlib import Path

    from stillroom.cli import main

    write_jsonl(
        tmp_path / "bench.jsonl",
        [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "kind": "math"} for i in range(2)],
    )
    serve = Path(sys.executable).parent / "transformers"
    backend = {
        "backend": "sglang",
        "stop_by": "strings",  # transformers serve takes only OpenAI's fields
        "concurrency": 4,
        "server": {
            "command": f"{serve} serve {{model_path}} "
            "--host 127.0.0.1 --port {port} --device cpu",
            "startup_timeout_s": 120,
        },
    }
    common = {
        "model_name": "base",
        "benchmark": "b",
        "samples": 2,
        "temperature": 1.0,
        "top_p": 1.0,
        "batch_size": 4,
        "effort": None,
        "effort_tag": "{reasoning effort: $effort}",
        "seed": 3,
        "backend": backend,
    }
    args = ["evaluate", "--model", str(setup / "base"), "--problems", str(tmp_path / "bench.jsonl")]
    long = {**common, "max_new_tokens": 16, "request_tokens": 6}
    assert (
        main([*args, "--out-samples", str(tmp_path / "long.jsonl"), "--params", json.dumps(long)])
        == 0
    )
    rows = read_jsonl(tmp_path / "long.jsonl")
    assert len(rows) == 4 and any(len(r.get("segments", [])) >= 2 for r in rows)
    assert all(
        r["completion_tokens"] <= 16 + 2 for r in rows
    )  # re-tokenised text may differ by a token
    forced = {**common, "max_new_tokens": 16, "budget": 5, "answer_tokens": 4}
    assert (
        main(
            [*args, "--out-samples", str(tmp_path / "forced.jsonl"), "--params", json.dumps(forced)]
        )
        == 0
    )
    rows = read_jsonl(tmp_path / "forced.jsonl")
    assert all(r["forced"] and "</think>" in r["response"] for r in rows)


def _bench(tmp_path, n):
    path = tmp_path / "bench.jsonl"
    write_jsonl(
        path,
        [{"prompt": f"What is {i} + {i % 3}?", "answer": str(i), "kind": "math"} for i in range(n)],
    )
    return path


PARAMS = {
    "model_name": "base",
    "benchmark": "b",
    "samples": 2,
    "temperature": 0.7,
    "top_p": 0.95,
    "batch_size": 4,
    "effort": None,
    "effort_tag": "{reasoning effort: $effort}",
    "seed": 3,
    "max_new_tokens": 24,
}


@pytest.mark.slow
def test_a_killed_evaluation_resumes_to_the_same_samples(setup, tmp_path):
    """SIGKILL mid-run, twice: no output that looks complete is left, finished batches are not
    sampled again, and the resumed file equals an uninterrupted run's byte for byte."""
    import signal
    import subprocess
    import sys
    import time

    from stillroom.stages import evaluate

    bench = _bench(tmp_path, 12)  # 6 batches of 2 problems x 2 samples
    reference = tmp_path / "reference.jsonl"
    evaluate.run(
        model=str(setup / "base"),
        problems=str(bench),
        out_samples=str(reference),
        params=PARAMS,
        log=lambda _: None,
    )
    out = tmp_path / "killed.jsonl"
    partial = tmp_path / "killed.jsonl.partial"
    cmd = [sys.executable, "-m", "stillroom", "evaluate", "--model", str(setup / "base")]
    cmd += ["--problems", str(bench), "--out-samples", str(out), "--params", json.dumps(PARAMS)]
    lines_at_kill = []
    for threshold in (1 + 4, 1 + 12, None):  # the fingerprint line, then 4 samples a batch
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while threshold and proc.poll() is None:
            if partial.exists() and partial.read_bytes().count(b"\n") >= threshold:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        _, err = proc.communicate(timeout=300)
        if threshold is None:
            assert proc.returncode == 0, err[-2000:]
            assert "resuming: " in err
        else:
            assert proc.returncode == -signal.SIGKILL, err[-2000:]
            assert not out.exists()
            lines_at_kill.append(partial.read_bytes().count(b"\n"))
    assert lines_at_kill[0] >= 5 and lines_at_kill[1] >= 13
    assert out.read_bytes() == reference.read_bytes()
    assert not partial.exists()


def test_a_partial_file_of_other_params_is_started_over(setup, tmp_path):
    from stillroom.io import Journal
    from stillroom.stages import evaluate

    bench = _bench(tmp_path, 2)
    out = tmp_path / "samples.jsonl"
    with Journal(out, fingerprint={"params": "other"}) as journal:
        journal.append([{"key": "stale", "response": "from another run"}])
    lines = []
    metrics = evaluate.run(
        model=str(setup / "base"),
        problems=str(bench),
        out_samples=str(out),
        params=PARAMS,
        log=lines.append,
    )
    assert any("starting over" in line for line in lines) and "resumed" not in metrics
    assert len(read_jsonl(out)) == 4 and "stale" not in out.read_text()
    (stale,) = tmp_path.glob("samples.jsonl.partial.stale-*")  # set aside, not deleted
    assert "from another run" in stale.read_text()


def test_answers_are_clamped_to_the_checkpoint_context(setup, tmp_path):
    import shutil

    from stillroom.io import DataError
    from stillroom.stages import evaluate

    model = tmp_path / "short"
    shutil.copytree(setup / "base", model)
    config = json.loads((model / "config.json").read_text())
    bench = _bench(tmp_path, 2)

    def run(context, params=PARAMS):
        config["max_position_embeddings"] = context
        (model / "config.json").write_text(json.dumps(config))
        out = tmp_path / f"ctx{context}.jsonl"
        metrics = evaluate.run(
            model=str(model),
            problems=str(bench),
            out_samples=str(out),
            params=params,
            log=lambda _: None,
        )
        return metrics, read_jsonl(out)

    metrics, rows = run(10_000)
    assert "context_clamped" not in metrics and all("context_limit" not in r for r in rows)
    assert max(r["completion_tokens"] for r in rows) == 24  # a random model runs to the limit
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    messages = [[{"role": "user", "content": f"What is {i} + {i % 3}?"}] for i in range(2)]
    texts = [
        tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages
    ]
    longest = max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    metrics, rows = run(longest + 10)
    assert metrics["context_clamped"] == 4
    assert all(r["context_limit"] == 10 and r["completion_tokens"] <= 10 for r in rows)
    forced = {**PARAMS, "budget": 16, "answer_tokens": 4}
    metrics, rows = run(longest + 20, forced)
    assert all(r["context_limit"] == 20 and r["completion_tokens"] <= 20 for r in rows)
    with pytest.raises(DataError, match=r"problem \w+ has a prompt of \d+ tokens.*context"):
        run(longest - 1)
    with pytest.raises(DataError, match="too few for any thinking before the forced close"):
        run(longest + 4, forced)


def test_the_samples_sidecar_records_the_stop_set(chat_students, tmp_path):
    """A Llama-3-style student's answers end at <|eot_id|> (its end of turn) as well as at its
    generation_config's eos ids; the sidecar says which set, and only cut-off answers count as cap
    hits."""
    from stillroom.cli import main
    from stillroom.provenance.sidecars import read_sidecar
    from stillroom.runtime.stops import stop_set

    model, out = str(chat_students["llama3"]), tmp_path / "samples.jsonl"
    params = {**PARAMS, "model_name": "llama3", "samples": 8, "temperature": 1.0, "top_p": 1.0}
    args = ["evaluate", "--model", model, "--problems", str(_bench(tmp_path, 3))]
    assert main([*args, "--out-samples", str(out), "--params", json.dumps(params)]) == 0
    metrics = read_sidecar(out)["metrics"]
    assert metrics["stops"] == json.loads(json.dumps(stop_set(model).dump()))
    assert "<|eot_id|>" in metrics["stops"]["strings"]
    rows = read_jsonl(out)
    cut = [r for r in rows if r["finish_reason"] == "length"]
    assert 0 < len(cut) < len(rows) and all(r["completion_tokens"] == 24 for r in cut)
    assert metrics["cap_hit_rate"] == round(len(cut) / len(rows), 4)


def test_an_evaluation_job_s_params_are_eval_s_decoding_and_the_student_s_effort_tag():
    exp = Experiment.parse(default_config())
    job = json.loads(evaluate.job_params(exp, "merge-0.5", "heldout").as_param())
    assert job["model_name"] == "merge-0.5" and job["benchmark"] == "heldout"
    assert job["seed"] == exp.seed and job["samples"] == exp.eval.samples
    assert job["effort_tag"] == exp.student.effort_tag
    # no budget: the forcing settings are not its params, nor eval's benchmark list
    assert not {"budget", "benchmarks", "budget_force", *Forcing.model_fields} & set(job)
    budget = evaluate.budget_job_params(exp, "sft", "heldout", "16")
    assert budget.budget == 16  # the wildcard's text, an int in params
    assert budget.answer_tokens == exp.eval.budget_force.answer_tokens
    assert json.loads(budget.as_param())["answer_cue"] == exp.eval.budget_force.answer_cue
    effort = json.loads(evaluate.effort_job_params(exp, "sft", "heldout", "low").as_param())
    assert effort == {**job, "model_name": "sft", "effort": "low"}
