"""The one renderer of every table kind: Markdown and LaTeX from columns over shown rows, the CSV
from the table's schema; rows read by name."""

import pandas as pd
import pytest

from stillroom.analysis.grids import grade_grid, score_matrix
from stillroom.analysis.tables import render
from stillroom.analysis.tables.render import Column, Grid
from stillroom.analysis.tables.schema import frame, load, named_rows
from stillroom.io import DataError, write_jsonl


def _rows():
    return [
        {
            "teacher": "api",
            "effort": "medium",
            "prompts": 8,
            "prompts_shared": 6,
            "samples": 12,
            "accuracy": 0.5,
            "mean_tokens": 40.25,
        },
        {
            "teacher": "self_host",
            "effort": "low",
            "prompts": 6,
            "prompts_shared": 6,
            "samples": 12,
            "accuracy": 0.25,
            "mean_tokens": 20.0,
            "reference_teacher": "api",
            "reference_effort": "medium",
            "delta_tokens": -20.25,
            "tokens_ci_low": -22.0,
            "tokens_ci_high": -18.5,
            "token_ratio": 20.0 / 40.25,
        },
    ]


def test_named_rows_are_the_schemas_columns_typed():
    rows = named_rows(frame("teachers", _rows()))
    assert rows[0]._fields[:3] == ("teacher", "effort", "prompts")
    assert rows[0].teacher == "api" and rows[1].prompts == 6
    assert pd.isna(rows[0].reference_effort) and pd.isna(rows[0].token_ratio)
    with pytest.raises(DataError, match="not a stillroom table"):
        named_rows(pd.DataFrame({"a": [1]}))


def test_markdown_is_a_heading_then_paragraphs_and_grids_after_blank_lines():
    rows = named_rows(frame("teachers", _rows()))
    grid = Grid(
        [
            Column("teacher", lambda r: r.teacher),
            Column(
                "Δ tokens",
                lambda r: render.interval(
                    r.delta_tokens, r.tokens_ci_low, r.tokens_ci_high, "+.1f"
                ),
            ),
            Column("× api", lambda r: render.ratio(r.token_ratio)),
        ],
        rows,
    )
    text = render.markdown("the caption", grid, "A note.", Grid(grid.columns, []))
    assert text == (
        "### the caption\n\n"
        "| teacher | Δ tokens | × api |\n"
        "|---|---|---|\n"
        "| api | — | — |\n"
        "| self_host | -20.2 [-22.0, -18.5] | 0.50× |\n\n"
        "A note.\n\n"
        "| teacher | Δ tokens | × api |\n"
        "|---|---|---|\n"
    )
    # a mirrored zero is +0.000; a missing value is —, or what the cell asks for
    assert render.interval(-0.0, -0.0, 0.0) == "+0.000 [+0.000, +0.000]"
    assert render.fmt(pd.NA, ".1f", "---") == "---" and render.cap_cell(0.2, 0.1) == "0.200 †"


def test_latex_aligns_each_column_and_escapes_the_caption():
    rows = named_rows(frame("teachers", _rows()))
    grid = Grid(
        [
            Column("Teacher", lambda r: render.esc(r.teacher), "l"),
            Column("Acc.", lambda r: f"{r.accuracy:.3f}"),
        ],
        rows,
    )
    tex = render.latex(grid, "Δ of 50% × 2_a", "tab:x")
    lines = tex.splitlines()
    assert lines[3] == "\\begin{tabular}{lr}"
    assert lines[5:10] == [
        "Teacher & Acc. \\\\",
        "\\midrule",
        "api & 0.500 \\\\",
        "self\\_host & 0.250 \\\\",
        "\\bottomrule",
    ]
    assert "\\caption{$\\Delta$ of 50\\% $\\times$ 2\\_a}" in tex and "\\label{tab:x}" in tex


class _Teachers:
    """A table kind with a Markdown layout and no LaTeX one."""

    def __init__(self):
        self.df = frame("teachers", _rows())

    def markdown(self):
        return render.markdown(
            "t", Grid([Column("teacher", lambda r: r.teacher)], named_rows(self.df))
        )


def test_write_gives_markdown_and_the_csv_of_record_and_refuses_latex_a_kind_has_not(tmp_path):
    table = _Teachers()
    text = render.write(table, tmp_path / "t.md", tmp_path / "t.csv")
    assert (
        (tmp_path / "t.md").read_text()
        == text
        == "### t\n\n| teacher |\n|---|\n| api |\n| self_host |\n"
    )
    assert load(tmp_path / "t.md").equals(table.df)
    with pytest.raises(TypeError, match="_Teachers has no LaTeX layout"):
        render.write(table, tmp_path / "u.md", tmp_path / "u.csv", tmp_path / "u.tex")
    assert not (tmp_path / "u.tex").exists()


def test_grids_are_named(tmp_path):
    path = tmp_path / "g.jsonl"
    write_jsonl(
        path,
        [
            {
                "prompt_id": p,
                "sample_index": s,
                "completion_tokens": 10 + s,
                "grade": {"correct": p == "a"},
                "finish_reason": "length" if s else "stop",
            }
            for p in ("a", "b")
            for s in (0, 1)
        ]
        + [
            {
                "prompt_id": "c",
                "sample_index": 0,
                "completion_tokens": 1,
                "grade": {"correct": False, "status": "gold_unparseable"},
            }
        ],
    )
    g = grade_grid(str(path))
    assert g.index == {"a": 0, "b": 1} and g.excluded == 1
    assert g.grades[0, 0] == {"correct": True} and g.tokens.tolist() == [[10, 11], [10, 11]]
    s = score_matrix(str(path))
    assert s.score.tolist() == [[1.0, 1.0], [0.0, 0.0]] and s.capped.tolist() == [[0, 1], [0, 1]]
    # still a tuple, in the order stages/merge.py's select reads it
    assert s[1] is s.score and s[2] is s.tokens
