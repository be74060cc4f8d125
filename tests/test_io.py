"""The journal long jobs resume from: finished records kept, a torn tail dropped, a corrupt middle
named, and a journal of other inputs started over."""

import pytest

from stillroom.io import DataError, Journal, read_jsonl


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


def test_a_torn_last_line_is_dropped_and_cut(tmp_path):
    out, lines = tmp_path / "out.jsonl", []
    partial = tmp_path / "out.jsonl.partial"
    partial.write_text('{"key": "a"}\n{"key": "b", "resp')
    journal = Journal(out, lines.append)
    assert list(journal.load()) == ["a"]
    assert partial.read_text() == '{"key": "a"}\n' and "torn" in lines[0]


def test_a_corrupt_middle_line_is_named(tmp_path):
    (tmp_path / "out.jsonl.partial").write_text('{"key": "a"}\nnot json\n{"key": "b"}\n')
    with pytest.raises(DataError, match=r"out.jsonl.partial:2: corrupt record"):
        Journal(tmp_path / "out.jsonl").load()


@pytest.mark.parametrize("first", ['{"fingerprint": {"params": 2}}\n', ""])
def test_a_journal_of_other_inputs_is_started_over(tmp_path, first):
    partial = tmp_path / "out.jsonl.partial"
    partial.write_text(first + '{"key": "a"}\n')
    lines = []
    journal = Journal(tmp_path / "out.jsonl", lines.append, fingerprint={"params": 1})
    assert journal.load() == {} and not partial.exists()
    assert "starting over" in lines[0]
    with journal:
        journal.append([{"key": "b"}])
    assert list(Journal(tmp_path / "out.jsonl", fingerprint={"params": 1}).load()) == ["b"]
