"""One renderer for every table kind: the CSV of record from the table's schema (schema.write_csv),
Markdown and LaTeX from its layout, a list of columns (a header and a cell of a shown row) over the
rows it shows. A shown row is a row of the schema (``schema.named_rows``) or a few of them together
(a model's rows against each reference)."""

from __future__ import annotations

import html as html_lib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from ...io import write_text
from .schema import write_csv


def fmt(value: Any, spec: str, missing: str = "—") -> str:
    """A cell for Markdown or LaTeX: ``missing`` where the table has no value."""
    return missing if pd.isna(value) else format(value, spec)


def interval(delta: Any, low: Any, high: Any, spec: str = "+.3f") -> str:
    """Δ [low, high], or — where the table has no comparison."""
    if pd.isna(delta):
        return "—"
    # + 0.0: a mirrored zero prints as +0.000, not -0.000
    return f"{delta + 0.0:{spec}} [{low + 0.0:{spec}}, {high + 0.0:{spec}}]"


def ratio(value: Any) -> str:
    """A token ratio as 0.75×, or — where there is none."""
    return fmt(value, ".2f") + ("" if pd.isna(value) else "×")


def cap_cell(rate: Any, flag: float, spec: str = ".3f") -> str:
    """The cap-hit rate, marked † above ``flag`` (its accuracy counts cut-off answers as wrong)."""
    return fmt(rate, spec) + (" †" if not pd.isna(rate) and rate > flag else "")


_LATEX_SPECIAL = {
    "\\": "\\textbackslash{}",
    "&": "\\&",
    "%": "\\%",
    "$": "\\$",
    "#": "\\#",
    "_": "\\_",
    "{": "\\{",
    "}": "\\}",
    "~": "\\textasciitilde{}",
    "^": "\\textasciicircum{}",
    "Δ": "$\\Delta$",
    "×": "$\\times$",
    "†": "$^\\dagger$",
}


def esc(text: str) -> str:
    """pdflatex-safe: specials escaped, the caption's Unicode as math."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


@dataclass(frozen=True)
class Column:
    """One column of a rendered table: its header and its cell of a shown row."""

    header: str
    cell: Callable[[Any], str]
    align: str = "r"  # LaTeX's column alignment


@dataclass(frozen=True)
class Grid:
    """Columns over the rows a table shows."""

    columns: Sequence[Column]
    rows: Sequence[Any]

    def header(self) -> list[str]:
        return [c.header for c in self.columns]

    def cells(self) -> list[list[str]]:
        return [[c.cell(row) for c in self.columns] for row in self.rows]


def markdown(title: str, *parts: str | Grid) -> str:
    """A ``###`` heading (the caption), then each part, a paragraph or a table, after a blank
    line."""
    out = [f"### {title}"]
    for part in parts:
        if isinstance(part, Grid):
            lines = ["| " + " | ".join(part.header()) + " |", "|" + "---|" * len(part.columns)]
            lines += ["| " + " | ".join(cells) + " |" for cells in part.cells()]
            out.append("\n".join(lines))
        else:
            out.append(part)
    return "\n\n".join(out) + "\n"


def latex(grid: Grid, caption: str, label: str) -> str:
    """A booktabs table; the headers and cells are LaTeX already, the caption is escaped."""
    out = [
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        f"\\begin{{tabular}}{{{''.join(c.align for c in grid.columns)}}}",
        "\\toprule",
        " & ".join(grid.header()) + " \\\\",
        "\\midrule",
        *(" & ".join(cells) + " \\\\" for cells in grid.cells()),
        "\\bottomrule",
        "\\end{tabular}",
        f"\\caption{{{esc(caption)}}}",
        f"\\label{{{label}}}",
        "\\end{table}",
    ]
    return "\n".join(out) + "\n"


class Table(Protocol):
    """What every table kind gives the renderer: its data (typed by its schema) and its Markdown
    layout; a table that has a LaTeX layout too has ``latex()``."""

    df: pd.DataFrame

    def markdown(self) -> str: ...


# The page's look, kept plain: the report shows it in a frame beside its own dark menu.
_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;color:#111;max-width:70em}"
    "h3{font-size:1em;font-weight:normal;line-height:1.4}"
    "table{border-collapse:collapse;margin:1em 0}"
    "th,td{border:1px solid #bbb;padding:.25em .6em;text-align:right}"
    "th:first-child,td:first-child{text-align:left}"
    "dt{font-weight:bold}dd{margin:0 0 .4em 1.5em;font-family:monospace}"
)


def html(markdown_text: str, params: Mapping[str, Any]) -> str:
    """A table's page for ``snakemake --report``, which shows an HTML result inline and any other
    file only as a download: the Markdown (its caption, with the notes, above the table) as HTML,
    then the job's parameters as a key/value list."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown_text)
    items = "".join(
        f"<dt>{html_lib.escape(key)}</dt><dd>{html_lib.escape(_param(value))}</dd>"
        for key, value in sorted(params.items())
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<style>{_STYLE}</style></head><body>\n{body}"
        f"<h4>Job parameters</h4>\n<dl>{items}</dl>\n</body></html>\n"
    )


def _param(value: Any) -> str:
    """A parameter's value as the config spells it: text as is, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def write(
    table: Table,
    out_markdown: str | os.PathLike,
    out_csv: str | os.PathLike,
    out_latex: str | os.PathLike | None = None,
    out_html: str | os.PathLike | None = None,
    params: Mapping[str, Any] | None = None,
) -> str:
    """Write the table's Markdown, its CSV and (where asked) its LaTeX and its report page with
    ``params``; the Markdown, for the log."""
    text = table.markdown()
    write_text(out_markdown, text)
    write_csv(table.df, out_csv)
    if out_html:
        write_text(out_html, html(text, params or {}))
    if out_latex:
        if not hasattr(table, "latex"):
            raise TypeError(f"{type(table).__name__} has no LaTeX layout ({out_latex})")
        write_text(out_latex, table.latex())
    return text
