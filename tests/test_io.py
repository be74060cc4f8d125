"""The journal long jobs resume from: finished records kept, a torn tail dropped, a last record
without its newline repaired, a corrupt middle named, and a journal of other settings moved aside;
and the one JSONL reader, which names file and line for every kind of bad line."""

import json

import pytest

from stillroom.io import DataError, Journal, fingerprint_diff, iter_lines, parse_row, read_jsonl


def test_a_journal_resumes_and_finishes(tmp_path):
    out = tmp_path / "out.jsonl"
    with Journal(out, fingerprint={"params": 1}) as journal:
        journal.append([{"key": "a"}, {"key": "b"}])
    assert not out.exists()
    journal = Journal(out, fingerprint={"params": 1})
    assert sorted(journal.load()) == ["a", "b"]
    with journal:
        journal.append([{"key": "c"}])
    assert sorted(Journal(out, fingerprint={"params": 1}).load()) == ["a", "b", "c"]
    journal.finish([{"key": k} for k in "abc"])
    assert [r["key"] for r in read_jsonl(out)] == ["a", "b", "c"]
    assert not journal.partial.exists()


@pytest.mark.parametrize(
    "tail",
    [
        b'{"key": "b", "resp',
        # torn inside the 2-byte UTF-8 form of "é"
        '{"key": "b", "response": "caf\u00e9"}'.encode()[:-4],
    ],
    ids=["mid-record", "mid-character"],
)
def test_a_torn_last_line_is_dropped_and_cut(tmp_path, tail):
    out, lines = tmp_path / "out.jsonl", []
    partial = tmp_path / "out.jsonl.partial"
    partial.write_bytes(b'{"key": "a"}\n' + tail)
    journal = Journal(out, lines.append)
    assert list(journal.load()) == ["a"]
    assert partial.read_text() == '{"key": "a"}\n'
    assert "torn" in lines[0] and f"{partial}:2:" in lines[0]


def test_a_last_record_without_its_newline_is_kept_and_the_next_append_starts_a_line(tmp_path):
    out, lines = tmp_path / "out.jsonl", []
    partial = tmp_path / "out.jsonl.partial"
    fp = json.dumps({"fingerprint": {"params": 1}})
    partial.write_text(fp + '\n{"key": "a"}\n{"key": "b"}')
    journal = Journal(out, lines.append, fingerprint={"params": 1})
    assert sorted(journal.load()) == ["a", "b"]
    assert f"{partial}:3: the last record lacked its newline" in lines[0]
    with journal:
        journal.append([{"key": "c"}])
    # killed again here: the file resumes, and keeps resuming
    assert sorted(Journal(out, fingerprint={"params": 1}).load()) == ["a", "b", "c"]
    assert partial.read_text() == fp + '\n{"key": "a"}\n{"key": "b"}\n{"key": "c"}\n'


@pytest.mark.parametrize(
    ("middle", "expected"),
    [
        (
            b"not json",
            r"partial:2: not valid JSON \(Expecting value at column 1\); a corrupt record",
        ),
        (b'{"key": "\xff"}', r"out.jsonl.partial:2: not UTF-8 text \(byte 0xff at column 10\)"),
        (b'{"response": "x"}', r"out.jsonl.partial:2: missing key 'key' \(row has: response\)"),
    ],
    ids=["bad-json", "undecodable", "no-key"],
)
def test_a_corrupt_middle_line_is_named(tmp_path, middle, expected):
    (tmp_path / "out.jsonl.partial").write_bytes(b'{"key": "a"}\n' + middle + b'\n{"key": "b"}\n')
    with pytest.raises(DataError, match=expected):
        Journal(tmp_path / "out.jsonl").load()


@pytest.mark.parametrize(
    ("first", "why"),
    [
        ('{"fingerprint": {"params": 2, "seed": 0}}\n', "other settings (params: 2 -> 1)"),
        ("", "has no fingerprint"),
    ],
)
def test_a_journal_of_other_settings_is_moved_aside_and_started_over(tmp_path, first, why):
    partial = tmp_path / "out.jsonl.partial"
    partial.write_text(first + '{"key": "a"}\n')
    lines = []
    journal = Journal(tmp_path / "out.jsonl", lines.append, fingerprint={"params": 1, "seed": 0})
    assert journal.load() == {} and not partial.exists()
    (stale,) = tmp_path.glob("out.jsonl.partial.stale-*")
    assert stale.read_text() == first + '{"key": "a"}\n'  # set aside, never deleted
    assert str(partial) in lines[0] and why in lines[0] and stale.name in lines[0]
    with journal:
        journal.append([{"key": "b"}])
    fp = {"params": 1, "seed": 0}
    assert list(Journal(tmp_path / "out.jsonl", fingerprint=fp).load()) == ["b"]


def test_fingerprint_diff_names_nested_settings():
    old = {"samples": 3, "spec": {"error_rate": 0.1, "model": "m"}}
    new = {"samples": 1, "spec": {"error_rate": 0.2, "model": "m", "top_p": 1}}
    assert fingerprint_diff(old, new) == (
        "samples: 3 -> 1; spec.error_rate: 0.1 -> 0.2; spec.top_p: (unset) -> 1"
    )


def test_the_reader_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n\n{"prompt": "caf\xff"}\n')
    with pytest.raises(DataError, match=r"rows.jsonl:3: not UTF-8 text \(byte 0xff at column 16\)"):
        read_jsonl(path)
    path.write_bytes(b'{"prompt": "a"}\n\n{"answer": "b"}\n')
    with pytest.raises(DataError, match=r"rows.jsonl:3: missing key 'prompt' \(row has: answer\)"):
        read_jsonl(path, required=("prompt",))
    path.write_bytes(b'{"prompt": "a"}\n[1]\n')
    with pytest.raises(DataError, match=r"rows.jsonl:2: expected a JSON object, got list"):
        read_jsonl(path)
    assert list(iter_lines(path)) == [(1, '{"prompt": "a"}\n'), (2, "[1]\n")]


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            r'{"prompt": "ab\ud800c"}',
            r"key 'prompt' holds a lone surrogate \(\\ud800 at character 3\)",
        ),
        (
            r'{"meta": {"options": ["x", "\uDC00"]}}',
            r"key 'meta.options\[1\]' .+\\udc00 at character 1",
        ),
        (r'{"ok": 1, "a\ud83d": 2}', r"key name 'a\\ud83d' holds a lone surrogate"),
        (r'{"prompt": "\ude00\ud83d"}', r"key 'prompt' .+\\ude00 at character 1"),  # pair reversed
    ],
)
def test_a_lone_surrogate_is_named_where_the_row_is_read(tmp_path, line, expected):
    """Issue 29: JSON accepts "\\ud800", no UTF-8 writer does: it failed later, when the stage
    wrote it, as "'utf-8' codec can't encode character" without file or line."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n' + line + "\n")
    with pytest.raises(DataError, match=rf"^\S+rows.jsonl:2: {expected}") as info:
        read_jsonl(path)
    str(info.value).encode("utf-8")  # the message itself prints


def test_escapes_that_are_text_pass():
    # a whole pair is one character; an escaped backslash before "ud800" is no escape at all
    row = parse_row("f.jsonl", 1, r'{"p": "\ud83d\ude00 and \\ud800"}')
    assert row == {"p": "\U0001f600 and \\ud800"}
