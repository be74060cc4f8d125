"""Bad or degenerate input stops each stage with a DataError naming the source, the file, the line
and what was expected: undecodable bytes, torn or empty files, rows with an empty prompt or answer,
a dataset the datasets library cannot load."""

from __future__ import annotations

import json

import pytest

from stillroom.io import DataError, write_jsonl
from stillroom.stages import decontam, evaluate, generate, grade, pool
from stillroom.stages.train import run as train_stage

from ..conftest import synthetic_rows
from .test_generate import PARAMS, _shard

ROW = {"prompt": "What is 2 + 2?", "answer": "4", "kind": "math"}
LINE = json.dumps(ROW).encode() + b"\n"
# a valid line but for one byte that is not UTF-8
BAD_BYTE = b'{"prompt": "What is 2 \xff 2?", "answer": "4", "kind": "math"}\n'
# valid JSON, but a lone surrogate is no text: no UTF-8 writer takes it
SURROGATE = b'{"prompt": "What is 2 \\ud800 2?", "answer": "4", "kind": "math"}\n'
LONE = r"key 'prompt' holds a lone surrogate \(\\ud800 at character 11\), which is not text"
# the same problem twice, once with other spacing
TWICE = LINE + json.dumps({**ROW, "prompt": "What is 2  +  2? "}).encode() + b"\n"


def _pool(tmp_path, source, benchmarks=None):
    pool.build_pool(
        benchmarks=benchmarks or {},
        out_pool=str(tmp_path / "pool.jsonl"),
        out_heldout=str(tmp_path / "heldout.jsonl"),
        out_dev=str(tmp_path / "dev.jsonl"),
        params={"heldout": {"size": 0}, "sources": [source]},
        log=lambda _: None,
    )


def _file(tmp_path, data: bytes, name="in.jsonl"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _jsonl_source(tmp_path, data):
    _pool(tmp_path, {"name": "web", "kind": "jsonl", "path": _file(tmp_path, data)})


def _dataset_source(tmp_path, data, name="in.jsonl"):
    path = _file(tmp_path, data, name)
    _pool(tmp_path, {"name": "ds", "kind": "dataset", "path": path, "answer_kind": "math"})


def _decontam(tmp_path, data):
    pool_path = tmp_path / "pool.jsonl"
    write_jsonl(pool_path, [])
    decontam.run(
        pool=str(pool_path),
        benchmarks={"aime": _file(tmp_path, data)},
        out_clean=str(tmp_path / "clean.jsonl"),
        out_report=str(tmp_path / "report.json"),
        params={},
        log=lambda _: None,
    )


def _grade(tmp_path, data):
    grade.run(
        samples=_file(tmp_path, data),
        out_graded=str(tmp_path / "graded.jsonl"),
        params={},
        log=lambda _: None,
    )


def _train(tmp_path, data):
    # the dataset is read before the base model is opened
    train_stage(
        base=tmp_path / "base", dataset=_file(tmp_path, data), out_model=tmp_path / "out", params={}
    )


def _resume(tmp_path, middle):
    shard = _shard(tmp_path, 4)
    fp = {**generate.fingerprint(generate.Params.parse(PARAMS)), "effort": "low"}
    first = json.dumps({"fingerprint": fp}).encode() + b"\n"
    _file(tmp_path, first + middle + b'{"key": "x"}\n', "gen.jsonl.partial")
    generate.run(
        shard=shard, out_samples=str(tmp_path / "gen.jsonl"), params=PARAMS, log=lambda _: None
    )


def _evaluate(tmp_path, data):
    evaluate.load_problems(_file(tmp_path, data), "aime")


SFT_LINE = json.dumps(synthetic_rows(1)[0]).encode() + b"\n"
SAMPLE = {"key": "k", "response": "\\boxed{4}", **ROW}
SAMPLE_BAD = json.dumps(SAMPLE).encode().replace(b"4}", b"\xff}", 1) + b"\n"

CASES = {
    "pool source, undecodable byte": (
        lambda t: _jsonl_source(t, LINE + BAD_BYTE),
        r"^source 'web': \S+in\.jsonl:2: not UTF-8 text \(byte 0xff at column 23\)$",
    ),
    "pool source, empty file": (
        lambda t: _jsonl_source(t, b""),
        r"^source 'web': \S+in\.jsonl: no items \(the file is empty\); expected one JSON object "
        r"a line with keys prompt, answer, kind$",
    ),
    "pool source, empty answer": (
        lambda t: _jsonl_source(t, LINE + json.dumps({**ROW, "answer": " "}).encode()),
        r"^source 'web': \S+in\.jsonl:2: key 'answer' is empty; expected text$",
    ),
    "pool source, empty prompt": (
        lambda t: _jsonl_source(t, json.dumps({**ROW, "prompt": ""}).encode()),
        r"^source 'web': \S+in\.jsonl:1: key 'prompt' is empty; expected text$",
    ),
    "pool source, lone surrogate": (
        lambda t: _jsonl_source(t, LINE + SURROGATE),
        rf"^source 'web': \S+in\.jsonl:2: {LONE}; expected a character or a whole surrogate pair$",
    ),
    "dataset source, lone surrogate": (
        lambda t: _dataset_source(t, SURROGATE),
        rf"^source 'ds': \S+in\.jsonl:1: {LONE}",
    ),
    "dataset source, truncated JSONL": (
        lambda t: _dataset_source(t, LINE + LINE[:20]),
        r"^source 'ds': \S+in\.jsonl:2: not valid JSON \(Unterminated string "
        r"starting at at column 12\)$",
    ),
    "dataset source, empty JSONL": (
        lambda t: _dataset_source(t, b"\n"),
        r"^source 'ds': \S+in\.jsonl: no rows \(the file holds no JSON object\)$",
    ),
    "dataset source, undecodable byte": (
        lambda t: _dataset_source(t, BAD_BYTE),
        r"^source 'ds': \S+in\.jsonl:1: not UTF-8 text \(byte 0xff at column 23\)$",
    ),
    "dataset source, the datasets library fails": (
        lambda t: _dataset_source(t, b"not parquet", "in.parquet"),
        r"^source 'ds': \S+in\.parquet: cannot load \(\w+: .+\)$",
    ),
    "decontam benchmark, undecodable byte": (
        lambda t: _decontam(t, BAD_BYTE),
        r"^benchmark 'aime': \S+in\.jsonl:1: not UTF-8 text \(byte 0xff at column 23\)$",
    ),
    "decontam benchmark, empty file": (
        lambda t: _decontam(t, b""),
        r"^benchmark 'aime': \S+in\.jsonl: no items \(the file is empty\)",
    ),
    "decontam benchmark, no items": (
        lambda t: _decontam(t, b"\n\n"),
        r"^benchmark 'aime': \S+in\.jsonl: no items \(only blank lines\)",
    ),
    "decontam benchmark, a problem listed twice": (
        lambda t: _decontam(t, TWICE),
        r"^benchmark 'aime': \S+in\.jsonl:2: the prompt is also line 1's \(prompt id [0-9a-f]+, "
        r"from the text with whitespace and Unicode normalised\); a benchmark lists each problem "
        r"once \(drop one of lines 1 and 2\)$",
    ),
    "evaluation benchmark, a problem listed twice": (
        lambda t: _evaluate(t, TWICE),
        r"^benchmark 'aime': \S+in\.jsonl:2: the prompt is also line 1's",
    ),
    "evaluation benchmark, empty file": (
        lambda t: _evaluate(t, b""),
        r"^benchmark 'aime': \S+in\.jsonl: no items \(the file is empty\)",
    ),
    "grade, undecodable byte in a generated shard": (
        lambda t: _grade(t, json.dumps(SAMPLE).encode() + b"\n" + SAMPLE_BAD),
        r"^\S+in\.jsonl:2: not UTF-8 text \(byte 0xff at column \d+\)$",
    ),
    "grade, lone surrogate in a generated shard": (
        lambda t: _grade(t, json.dumps(SAMPLE).encode().replace(b"4}", b"\\udfff}", 1) + b"\n"),
        r"^\S+in\.jsonl:1: key 'response' holds a lone surrogate \(\\udfff at character 8\)",
    ),
    "train, undecodable byte in the dataset": (
        lambda t: _train(t, SFT_LINE + SFT_LINE.replace(b'"user"', b'"us\xffer"')),
        r"^\S+in\.jsonl:2: not UTF-8 text \(byte 0xff at column \d+\)$",
    ),
    "generation resume, undecodable byte in the partial": (
        lambda t: _resume(t, b'{"key": "\xff"}\n'),
        r"^\S+gen\.jsonl\.partial:2: not UTF-8 text \(byte 0xff at column 10\); a corrupt "
        r"record, not one a kill leaves \(move the resume file aside to start over\)$",
    ),
    "generation resume, a record without key": (
        lambda t: _resume(t, b'{"response": "x"}\n'),
        r"^\S+gen\.jsonl\.partial:2: missing key 'key' \(row has: response\); a corrupt record",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_named_error(tmp_path, case):
    make, expected = CASES[case]
    with pytest.raises(DataError, match=expected) as info:
        make(tmp_path)
    if "datasets library" in case:
        assert info.value.__cause__ is not None  # the library's own error stays chained
