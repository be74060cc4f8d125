"""Stop sets of a Llama-3-style and a Gemma-style student (tests/chat_students.py): found from the
checkpoint, obeyed by the in-process backend (each stop id ends answers; only the cap makes a cap
hit), by continuation and budget forcing, and carried by every served backend's requests."""

import json
import shutil
import sys

import pytest

from stillroom.io import DataError
from stillroom.runtime.decoding import END_THINK, budget_force, continue_truncated
from stillroom.runtime.lm import LocalLM
from stillroom.runtime.stops import stop_set

EXPECTED = {
    "llama3": {
        "strings": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "generation_config": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "chat_template": "<|eot_id|>",
        "tokenizer_eos": "<|end_of_text|>",
    },
    "gemma": {
        "strings": ["<eos>", "<end_of_turn>"],
        "generation_config": ["<eos>"],
        "chat_template": "<end_of_turn>",
        "tokenizer_eos": "<eos>",
    },
}
STYLES = list(EXPECTED)


@pytest.fixture(scope="module")
def lms(chat_students):
    return {style: LocalLM(str(path)) for style, path in chat_students.items()}


def prompt(lm, text="What is 2 + 3?"):
    return lm.encode(lm.render([{"role": "user", "content": text}]))


@pytest.mark.parametrize("style", STYLES)
def test_the_stop_set_joins_generation_config_template_and_tokenizer(chat_students, style):
    stops = stop_set(str(chat_students[style]))
    want = EXPECTED[style]
    assert list(stops.strings) == want["strings"]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_students[style])
    assert list(stops.ids) == tok.convert_tokens_to_ids(want["strings"])
    assert stops.sources == {
        "generation_config": tok.convert_tokens_to_ids(want["generation_config"]),
        "chat_template": tok.convert_tokens_to_ids(want["chat_template"]),
        "tokenizer_eos": tok.convert_tokens_to_ids(want["tokenizer_eos"]),
    }
    assert json.loads(json.dumps(stops.dump()))["ids"] == list(stops.ids)


def test_a_model_with_no_stop_token_is_refused(chat_students, tmp_path):
    from transformers import AutoTokenizer

    model = tmp_path / "endless"
    shutil.copytree(chat_students["gemma"], model)
    (model / "generation_config.json").unlink()
    tok = AutoTokenizer.from_pretrained(model)
    tok.eos_token = None
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n\n{% endfor %}"
    with pytest.raises(DataError, match=r"endless: no stop token.*run to the token cap"):
        stop_set(str(model), tok)


@pytest.mark.parametrize("style", STYLES)
def test_in_process_answers_end_at_each_stop_id_and_only_the_cap_is_a_cap_hit(lms, style):
    lm = lms[style]
    stops = set(lm.stops.ids)
    out = lm.complete([prompt(lm)] * 64, temperature=1.0, max_new_tokens=48, seed=0)
    ends = set()
    for s in out:
        assert not stops & set(s.token_ids[:-1])  # nothing generated past a stop
        if s.finish_reason == "stop":
            assert s.token_ids[-1] in stops
            ends.add(s.token_ids[-1])
        else:
            assert s.finish_reason == "length" and s.completion_tokens == 48
    assert ends == stops  # every stop id ended some answer


@pytest.mark.parametrize("style", STYLES)
def test_continued_and_forced_answers_keep_to_the_stop_set(lms, style):
    lm = lms[style]
    stops = set(lm.stops.ids)
    assert END_THINK not in lm.stops.strings  # a forced end of thinking is no stop
    p = [prompt(lm)] * 16
    common = {"temperature": 1.0, "top_p": 1.0, "seed": 1}
    first = lm.complete(p, max_new_tokens=8, **common)
    continued = continue_truncated(lm, p, first, limit=40, request_tokens=8, **common)
    forced = budget_force(lm, p, budget=8, answer_tokens=16, cue=" ok", **common)
    assert any(len(a.segments) > 2 for a in continued) and any(a.forced for a in forced)
    for a in continued + forced:
        assert not stops & set(a.token_ids[:-1])
        assert (a.token_ids[-1] in stops) == (a.finish_reason == "stop")
    assert all(a.completion_tokens == 40 for a in continued if a.finish_reason == "length")


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("stop_by", ["strings", "token_ids"])
def test_an_openai_backend_sends_the_stop_set(chat_students, style, stop_by):
    from stillroom.stages.evaluate import open_lm
    from tests.fault_server import FaultServer

    backend = {"backend": "openai", "stop_by": stop_by, "concurrency": 2}
    with FaultServer() as server:
        with open_lm(str(chat_students[style]), {**backend, "base_url": server.base_url}) as lm:
            out = lm.complete([prompt(lm)] * 2, temperature=1.0, max_new_tokens=8, seed=0)
    assert [s.finish_reason for s in out] == ["stop", "stop"]
    stops = stop_set(str(chat_students[style]))
    want = (
        {"stop_token_ids": list(stops.ids)}
        if stop_by == "token_ids"
        else {"stop": list(stops.strings)}
    )
    for body in server.bodies:
        assert {k: body[k] for k in ("stop", "stop_token_ids") if k in body} == want


def test_a_server_refusing_stop_token_ids_is_a_clear_error_never_retried(chat_students):
    from stillroom.stages.evaluate import open_lm
    from tests.fault_server import FaultServer

    backend = {"backend": "openai", "stop_by": "token_ids", "concurrency": 1}
    with FaultServer(refuse_fields=("stop_token_ids",)) as server:
        with open_lm(str(chat_students["llama3"]), {**backend, "base_url": server.base_url}) as lm:
            with pytest.raises(ValueError, match=r"HTTP 400.*needs eval.backend.stop_by: strings"):
                lm.complete([prompt(lm)], temperature=1.0, max_new_tokens=8, seed=0)
    assert server.counts["requests"] == 1


def test_a_started_sglang_backend_sends_stop_token_ids(chat_students, tmp_path):
    """The sglang backend's default: ids, which SGLang (and vLLM) match before detokenising (their
    stop strings are matched on text without special tokens). SGLang cannot run here: the fault
    server stands in for it, started by the backend, and keeps the requests it gets."""
    from pathlib import Path

    from stillroom.stages.evaluate import open_lm

    script = Path(__file__).resolve().parent.parent / "fault_server.py"
    bodies = tmp_path / "bodies.jsonl"
    backend = {
        "backend": "sglang",
        "concurrency": 2,
        "server": {
            "command": f"{sys.executable} {script} {{port}} 0 {{model_path}}",
            "env": {"FAULT_SERVER_BODIES": str(bodies)},
        },
    }
    path = str(chat_students["llama3"])
    with open_lm(path, backend) as lm:
        out = lm.complete([prompt(lm)] * 2, temperature=0.6, max_new_tokens=8, seed=0)
    assert [s.finish_reason for s in out] == ["stop", "stop"]
    sent = [json.loads(line) for line in bodies.read_text().splitlines()]
    assert len(sent) == 2
    for body in sent:
        assert body.pop("prompt").endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert body.pop("seed") in (0, 1)
        assert body == {
            "model": path,
            "max_tokens": 8,
            "temperature": 0.6,
            "top_p": 1.0,
            "stop_token_ids": list(stop_set(path).ids),
        }


@pytest.fixture
def served(tmp_path):
    """Start `transformers serve` for a checkpoint (an OpenAI-compatible server that samples exactly
    as the in-process model does for a given seed); yields its base URL; always stopped."""
    import contextlib
    import os
    import signal
    import subprocess
    import time
    import urllib.request
    from pathlib import Path

    from stillroom.runtime.service import free_port

    @contextlib.contextmanager
    def serve(model):
        port = free_port()
        cmd = [str(Path(sys.executable).parent / "transformers"), "serve", str(model)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
        with open(tmp_path / f"serve-{port}.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None, (tmp_path / f"serve-{port}.log").read_text()[-2000:]
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    assert time.monotonic() < deadline, "transformers serve not healthy in 180 s"
                    time.sleep(0.5)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)

    return serve


@pytest.mark.slow
@pytest.mark.parametrize("style", STYLES)
def test_a_real_server_stops_where_the_model_in_process_stops(chat_students, lms, served, style):
    """The openai backend's `stop` strings against a real server, seed for seed against the
    in-process model: the same answers, ending and cut off alike. The Gemma-style generation_config
    lists only <eos>: without the stop list the server runs on past <end_of_turn>."""
    from stillroom.stages.evaluate import open_lm

    local, n, cap = lms[style], 24, 32
    p = prompt(local)
    # ServedLM seeds request i with seed + i
    ref = [local.complete([p], temperature=1.0, max_new_tokens=cap, seed=i)[0] for i in range(n)]
    ends = {s.token_ids[-1] for s in ref if s.finish_reason == "stop"}
    assert ends == set(local.stops.ids)  # each stop id ends some answer
    with served(chat_students[style]) as url:
        backend = {"backend": "openai", "base_url": url, "concurrency": 1}
        with open_lm(str(chat_students[style]), backend) as lm:
            out = lm.complete([p] * n, temperature=1.0, max_new_tokens=cap, seed=0)
            lm.stop_field = {}  # the request as it was before stop sets
            unstopped = lm.complete([p] * n, temperature=1.0, max_new_tokens=cap, seed=0)
    assert [(s.text, s.finish_reason) for s in out] == [(s.text, s.finish_reason) for s in ref]
    generation_eos = set(stop_set(str(chat_students[style])).sources["generation_config"])
    for s, before in zip(ref, unstopped, strict=True):
        if s.finish_reason == "stop" and s.token_ids[-1] not in generation_eos:
            assert before.finish_reason == "length" and before.text.startswith(s.text)
    if style == "gemma":
        assert any(before.finish_reason == "length" for before in unstopped)
