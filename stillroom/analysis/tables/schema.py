"""Tables as data: every result table is a pandas DataFrame with typed columns, written as CSV (the
data of record, full float precision) and rendered from it as Markdown and LaTeX (render.py);
``load`` reads a table back as that DataFrame, so a paper table can be regenerated or restyled in a
notebook.

Each kind of table has a fixed schema (its columns, in order, and their types); a table is known by
its CSV header.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ...io import DataError, write_text
from ..stats import VERDICT

STR, INT, FLOAT = "string", "Int64", "float64"
# "better" / "worse" / "tie", or missing where there is no comparison (a model against itself)
VERDICTS = pd.CategoricalDtype(list(VERDICT.values()))

# a model against a reference: the paired difference, its interval, p-values and verdict (Holm)
COMPARISON = {
    "reference": STR,
    "delta": FLOAT,
    "ci_low": FLOAT,
    "ci_high": FLOAT,
    "p_value": FLOAT,
    "p_holm": FLOAT,
    "verdict": VERDICTS,
}
SCHEMAS: dict[str, dict[str, Any]] = {
    # paired.py: one row per (model, reference)
    "paired": {
        "benchmark": STR,
        "model": STR,
        "problems": INT,
        "samples": INT,
        "accuracy": FLOAT,
        "mean_tokens": FLOAT,
        "cap_hit_rate": FLOAT,
        **COMPARISON,
        "mcnemar_p": FLOAT,
        "delta_tokens": FLOAT,
        "tokens_ci_low": FLOAT,
        "tokens_ci_high": FLOAT,
        "token_ratio": FLOAT,
    },
    # budget.py: one row per (model, thinking budget, method): budget forcing, compared with the
    # hard cutoff of the same samples, and that cutoff
    "budgets": {
        "benchmark": STR,
        "model": STR,
        "budget": INT,
        "method": STR,
        "samples": INT,
        "accuracy": FLOAT,
        "acc_ci_low": FLOAT,
        "acc_ci_high": FLOAT,
        "forced": FLOAT,
        "thinking": FLOAT,
        "tokens": FLOAT,
        **COMPARISON,
    },
    # effort.py: one row per (model or teacher, effort)
    "efforts": {
        "benchmark": STR,
        "model": STR,
        "effort": STR,
        "problems": INT,
        "samples": INT,
        "accuracy": FLOAT,
        "reference": STR,
        "delta": FLOAT,
        "ci_low": FLOAT,
        "ci_high": FLOAT,
        "verdict": VERDICTS,
        "mean_tokens": FLOAT,
        "delta_tokens": FLOAT,
        "tokens_ci_low": FLOAT,
        "tokens_ci_high": FLOAT,
        "token_ratio": FLOAT,
        "cap_hit_rate": FLOAT,
    },
    # teachers.py: one row per (teacher, effort) and reference effort
    "teachers": {
        "teacher": STR,
        "effort": STR,
        "prompts": INT,
        "prompts_shared": INT,
        "samples": INT,
        "accuracy": FLOAT,
        "mean_tokens": FLOAT,
        "reference_teacher": STR,
        "reference_effort": STR,
        "delta_tokens": FLOAT,
        "tokens_ci_low": FLOAT,
        "tokens_ci_high": FLOAT,
        "token_ratio": FLOAT,
    },
    # kernels.py: one row per (model, metric, reference)
    "kernels": {
        "benchmark": STR,
        "model": STR,
        "metric": STR,
        "rate": FLOAT,
        **COMPARISON,
    },
}
# the columns that name a row, the first of them what `audit --cell` takes
ROW_KEYS: dict[str, tuple[str, ...]] = {
    "paired": ("model", "reference"),
    "budgets": ("model", "budget", "method"),
    "efforts": ("model", "effort"),
    "teachers": ("teacher", "effort", "reference_teacher", "reference_effort"),
    "kernels": ("model", "metric", "reference"),
}


def frame(kind: str, rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """The DataFrame of a table of ``kind`` from its rows (dicts keyed by column; None is
    missing), every column of the schema typed."""
    schema = SCHEMAS[kind]
    df = pd.DataFrame([{k: r.get(k) for k in schema} for r in rows], columns=list(schema))
    return df.astype(schema)


def kind_of(columns: Iterable[str], where: str = "table") -> str:
    """The kind of table whose schema has exactly these columns, in this order."""
    columns = list(columns)
    for kind, schema in SCHEMAS.items():
        if columns == list(schema):
            return kind
    raise DataError(
        f"{where}: not a stillroom table: its columns {columns} match none of the table kinds "
        f"({', '.join(SCHEMAS)})"
    )


def write_csv(df: pd.DataFrame, path: str | os.PathLike) -> None:
    """The CSV of record: full float precision, a missing value as an empty cell."""
    kind_of(df.columns, str(path))
    write_text(path, df.to_csv(index=False, lineterminator="\n"))


def csv_path(path: str | os.PathLike) -> Path:
    """The CSV of a table given its .csv, .md, .tex or .png path, or its stem."""
    p = Path(path)
    if p.suffix in (".csv", ".md", ".tex", ".png"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".csv")


def load(path: str | os.PathLike) -> pd.DataFrame:
    """A table as a DataFrame with typed columns (ints as nullable Int64, floats as float64,
    verdicts as a category, text as strings; missing cells NA), from its CSV; ``path`` may name
    the table's .csv, .md, .tex or .png, or its stem."""
    csv = csv_path(path)
    if not csv.is_file():
        raise DataError(f"{path}: not a table: no CSV at {csv}")
    try:
        header = pd.read_csv(csv, nrows=0).columns
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DataError(f"{csv}: not a table: {exc}") from None
    schema = SCHEMAS[kind_of(header, str(csv))]
    # verdicts read as text first, so that an unknown one is named rather than made NA
    text = {k: STR if v is VERDICTS else v for k, v in schema.items()}
    try:
        df = pd.read_csv(csv, dtype=text, keep_default_na=False, na_values=[""])
    except ValueError as exc:
        raise DataError(f"{csv}: a column does not have its type: {exc}") from None
    if "verdict" in df:
        bad = df["verdict"].notna() & ~df["verdict"].isin(VERDICTS.categories)
        if bad.any():
            row = int(bad.to_numpy().argmax())
            raise DataError(
                f"{csv}: line {row + 2}: verdict '{df['verdict'][row]}', expected one of "
                f"{', '.join(VERDICTS.categories)} or empty"
            )
    return df.astype(schema)


def named_rows(df: pd.DataFrame) -> list[Any]:
    """The rows of a table as named tuples, a field per column of its schema (``row.delta``)."""
    return list(df.itertuples(index=False, name=kind_of(df.columns).capitalize()))
