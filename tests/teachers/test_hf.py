"""The hf backend: a local transformers model answering generation shards in batches."""

import pytest

from stillroom.data import sources
from stillroom.io import read_jsonl, write_jsonl
from stillroom.runtime.student import build_model, train_tokenizer
from stillroom.stages import generate

from ..conftest import TINY


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    rows = sources.generate("arithmetic", "a", 200, 1, max_operand=12)
    train_tokenizer([r["prompt"] for r in rows], root / "tok", vocab_size=300, min_frequency=2)
    build_model(root / "tok", root / "model", model=TINY, seed=0)
    return str(root / "model")


def test_hf_teacher_batches_local_generation(tmp_path, model_dir, monkeypatch):
    from stillroom.runtime.lm import LocalLM

    calls = []
    original = LocalLM.sample
    monkeypatch.setattr(
        LocalLM,
        "sample",
        lambda self, prompts, **kw: calls.append(len(prompts)) or original(self, prompts, **kw),
    )
    shard = tmp_path / "shard.jsonl"
    write_jsonl(shard, sources.generate("arithmetic", "b", 12, 2, max_operand=12))
    spec = {
        "backend": "hf",
        "model_path": model_dir,
        "batch_size": 8,
        "sampling": {"max_tokens": 10, "temperature": 1.0},
        "effort": {"system": "{reasoning effort: $effort}"},
        "context_length": 256,
    }
    m = generate.run(
        shard=str(shard),
        out_samples=str(tmp_path / "gen.jsonl"),
        log=lambda _: None,
        params={"teacher": "local", "spec": spec, "effort": "high", "samples": 2, "seed": 0},
    )
    rows = read_jsonl(tmp_path / "gen.jsonl")
    assert m["samples"] == len(rows) == 24 and m["failed"] == 0
    assert sum(calls) == 24 and max(calls) > 1  # requests were batched
    assert all(0 < r["completion_tokens"] <= 10 and r["model"] == model_dir for r in rows)
    assert all(
        r["sampling"]["max_tokens"] == 10 and r["finish_reason"] in ("stop", "length") for r in rows
    )


def test_hf_teacher_needs_a_model_path():
    from stillroom.config import ConfigError
    from stillroom.teachers import make_teacher

    with pytest.raises(ConfigError, match="teachers.local.model_path: required key missing"):
        make_teacher("local", {"backend": "hf"})
