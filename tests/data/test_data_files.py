"""Bad data files of issue 43: each is refused naming the file, the row and the reason, or every
row is accounted for (rows out = rows in, with the rows a filter drops counted and named)."""

import json
import re

import pytest

from stillroom.config import ConfigError, DatasetSpec
from stillroom.config.data import KernelBookSource
from stillroom.data import kernelbook
from stillroom.data.sources import dataset_records
from stillroom.io import DataError
from stillroom.provenance.sidecars import Notes


def records(path, log=None, **spec):
    return list(dataset_records(DatasetSpec.parse({"path": str(path), **spec}), "s", log or print))


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_csv_row_that_is_not_utf8_is_named_by_file_row_and_line(tmp_path):
    path = tmp_path / "web.csv"
    # row 1's quoted field spans two lines, so the Latin-1 row (row 2) is on line 6
    text = 'prompt,answer\nWhat is 1+1?,2\n"Two\n\nlines",3\nCaf\xe9 costs?,4\n'
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(DataError) as err:
        records(path)
    assert str(err.value) == (
        f"source 's': {path}:6: not UTF-8 text (byte 0xe9 at column 4) in row 2; save the file "
        "as UTF-8"
    )
    path.write_bytes("prompt,r\xe9ponse\n1,2\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"web\.csv:1: not UTF-8 text .* in its header"):
        records(path, answer="réponse")
    # the same rows in UTF-8: every row out, the one named above as row 2
    path.write_text(text, encoding="utf-8")
    got = records(path)
    assert [(r["meta"]["row"], r["answer"]) for r in got] == [(0, "2"), (1, "3"), (2, "4")]


def test_a_file_without_rows_is_refused_as_empty(tmp_path):
    import pandas as pd

    parquet = tmp_path / "none.parquet"
    pd.DataFrame(
        {"prompt": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)}
    ).to_parquet(parquet)
    with pytest.raises(DataError) as err:
        records(parquet)
    assert str(err.value) == (
        f"source 's': {parquet}: no rows (the Parquet file is empty: columns prompt, answer, 0 "
        "rows)"
    )
    # the KernelBook source reads through the same loader
    kb = KernelBookSource.parse(
        {"name": "kb", "kind": "kernelbook", "path": str(parquet)}, where="dataset.sft_sources.0"
    )
    with pytest.raises(
        DataError,
        match=rf"source 'kb': {re.escape(str(parquet))}: no rows \(the Parquet file is empty",
    ):
        list(kernelbook.rows(kb))
    header = tmp_path / "header.csv"
    header.write_text("prompt,answer\n\n")
    with pytest.raises(
        DataError, match=r"header\.csv: no rows \(the file is empty past its header\)$"
    ):
        records(header)
    (tmp_path / "zero.csv").write_bytes(b"")
    with pytest.raises(DataError, match=r"zero\.csv: no rows \(the file is empty\)$"):
        records(tmp_path / "zero.csv")


@pytest.mark.parametrize("name", ["pool.jsonl", "pool.parquet"])
def test_a_where_field_without_a_value_does_not_pass_and_is_counted(tmp_path, name):
    """A null, missing or NaN value passes no bound: its row is filtered out like one out of
    range, and the log names it; every row read is kept or counted as filtered."""
    rows = [
        {"prompt": "a", "answer": "1", "level": 3.0},
        {"prompt": "b", "answer": "2", "level": None},
        {"prompt": "c", "answer": "3"},
        {"prompt": "d", "answer": "4", "level": 0.5},
        {"prompt": "e", "answer": "5", "level": float("nan")},
        {"prompt": "f", "answer": "6", "level": 9.0},
    ]
    path = tmp_path / name
    if name.endswith(".parquet"):
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path)
    else:  # JSON has no NaN: that row's level is null there
        jsonl(path, [{**r, "level": None} if r.get("level") != r.get("level") else r for r in rows])
    logged = []
    got = records(path, logged.append, where={"level": {"min": 1}})
    assert [r["meta"]["row"] for r in got] == [0, 5]
    assert logged == [
        f"source 's': {path}: 2 of the 6 rows read kept (6 in all); 4 did not pass where, 3 of "
        "them for no value in 'level' (rows 1, 2, 4)"
    ]


def test_a_where_bound_that_cannot_compare_with_the_value_names_the_row(tmp_path):
    path = jsonl(
        tmp_path / "mixed.jsonl",
        [
            {"prompt": "a", "answer": "1", "level": 2},
            {"prompt": "b", "answer": "2", "level": "hard"},
        ],
    )
    with pytest.raises(DataError) as err:
        records(path, where={"level": {"max": 5}})
    assert str(err.value) == (
        f"source 's': {path} row 1: field 'level' is str 'hard', but where 'level' {{'max': 5.0}} "
        "compares it with a number; filter a numeric field, or use equals/in"
    )


def test_a_template_placeholder_other_than_prompt_is_refused_with_the_config(tmp_path):
    # one check, the config's, before any job: no row ever meets a template it cannot fill
    path = jsonl(tmp_path / "t.jsonl", [{"prompt": "Add 2 and 3.", "answer": "5"}])
    with pytest.raises(ConfigError, match=r"prompt_template: .*KeyError\('lang'\)"):
        records(path, prompt_template="Solve in $lang: $prompt")
    with pytest.raises(ConfigError, match=r"prompt_template: "):
        records(path, prompt_template="$prompt Costs: $5")
    got = records(path, prompt_template="$prompt Costs: $$5")
    assert got[0]["prompt"] == "Add 2 and 3. Costs: $5"


def test_jsonl_rows_are_named_by_their_line_past_blank_lines(tmp_path):
    """Line numbers count blank lines too, as an editor does."""
    path = tmp_path / "kb.jsonl"
    path.write_text('{"uuid": 1}\n\n{"uuid": 2}\n')
    kb = KernelBookSource.parse(
        {"name": "kb", "kind": "kernelbook", "path": str(path)}, where="dataset.sft_sources.0"
    )
    with pytest.raises(DataError, match=r"kb\.jsonl:1: column 'entry_point'"):
        list(kernelbook.rows(kb))
    assert [where for where, _ in kernelbook._raw_rows(kb, Notes())] == [f"{path}:1", f"{path}:3"]
