"""``stillroom audit <table> --recompute`` and ``--cell <model>``: a table's numbers checked against
the graded records they were built from.

``--recompute`` runs the stage that built the table again, on the inputs and params its sidecar
recorded (the seed and resample count among them), into a scratch directory, and compares the result
with the written table: the CSV cell by cell (typed, floats to 1e-9 relative), the Markdown and
LaTeX row by row, each difference named by its row and column. A cell edited by hand is caught
even when its sidecar's hash was rewritten to match.

``--cell <model>`` lists the graded records behind one row of a table (``--regrade`` grades them
again with the grader their grade stage used and names every verdict that changed), then walks from
the model's checkpoint to the training rows and the teacher records they came from.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.tables.schema import ROW_KEYS, SCHEMAS, csv_path, kind_of, load
from ..io import DataError, iter_jsonl, read_json
from ..provenance.audit import (
    Auditor,
    Problem,
    audit,
    format_tree,
    infer_root,
    modified_detail,
    problem_lines,
)
from ..provenance.sidecars import sidecar_path

SHOWN = 10  # records shown per list in the text report; --json has them all
# the stages that write tables (their CLI names, as sidecars record them) -> their functions in
# stillroom.stages.tables, as cli.STAGES names them (a test holds the two equal; importing the CLI
# here would make an import cycle)
TABLE_STAGES = {
    "tables": "run",
    "budget_tables": "budget_run",
    "effort_tables": "effort_run",
    "teacher_tables": "teacher_run",
    "kernel_tables": "kernel_tables",
}
REL_TOL = 1e-9  # floats are written at full precision: only the last bits may differ


# ---------------------------------------------------------------------------- the table's record


@dataclass
class Table:
    """A written table: its CSV, its sidecar (shared by every output of the job) and the directory
    the pipeline ran in (sidecar paths are relative to it)."""

    csv: Path
    prov: dict[str, Any]
    root: Path

    @property
    def stage(self) -> str:
        return self.prov["stage"]

    def path(self, recorded: str) -> Path:
        return Path(recorded) if Path(recorded).is_absolute() else self.root / recorded

    def shown(self, path: str | os.PathLike) -> str:
        """``path`` as the sidecars write it: relative to the root where it is under it."""
        p = Path(path)
        return str(p.relative_to(self.root)) if p.is_relative_to(self.root) else str(p)

    def inputs(self) -> dict[str, Any]:
        """The stage's inputs as it was called: a named list as {name: path}, one file as its
        path."""
        out: dict[str, Any] = {}
        for key, entry in (self.prov.get("inputs") or {}).items():
            if isinstance(entry, list):
                unnamed = [e["path"] for e in entry if "name" not in e]
                if unnamed:
                    raise DataError(
                        f"{sidecar_path(self.csv)}: input '{key}' records no names for "
                        f"{unnamed[0]} (a table built before input names were recorded); "
                        "rebuild the table"
                    )
                out[key] = {e["name"]: str(self.path(e["path"])) for e in entry}
            else:
                out[key] = str(self.path(entry["path"]))
        return out


def open_table(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Table:
    """The table ``path`` names (its .csv, .md, .tex or .png, or its stem), or a clear error."""
    csv = csv_path(Path(root, path) if root and not Path(path).is_absolute() else path)
    side = sidecar_path(csv)
    if not csv.is_file() or not side.is_file():
        missing = csv if not csv.is_file() else side
        raise DataError(f"{path}: not a table (no {missing}); give a table's .csv, .md or .tex")
    prov = read_json(side)
    stage = prov.get("stage")
    if stage not in TABLE_STAGES:
        raise DataError(
            f"{path}: not a table: {csv} was written by stage '{stage}', not by one of "
            f"{', '.join(TABLE_STAGES)}"
        )
    kind_of(pd.read_csv(csv, nrows=0).columns, str(csv))
    base = Path(root).resolve() if root else infer_root(csv.resolve()) or Path.cwd()
    return Table(csv, prov, base)


# -------------------------------------------------------------------------------- --recompute


@dataclass
class Difference:
    file: str
    row: str  # the row's key (model, reference, ...) or its line
    column: str
    written: str
    recomputed: str
    key: str = ""  # the row's model: a rendered row is matched to the CSV's by it
    more_rows: int = 0  # the model's other rows (one per reference) with this very difference

    def where(self) -> str:
        more = f" (+{self.more_rows} row(s) of it)" if self.more_rows else ""
        return f"{self.file}: {self.row}: {self.column}{more}"

    def __str__(self) -> str:
        return f"{self.where()}: written {self.written}, recomputed {self.recomputed}"


def _row_label(kind: str, row: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={row[k]}" for k in ROW_KEYS[kind] if not pd.isna(row[k]))


def _same(a: Any, b: Any) -> bool:
    if pd.isna(a) or pd.isna(b):
        return bool(pd.isna(a) and pd.isna(b))
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(float(a), float(b), rel_tol=REL_TOL, abs_tol=1e-12)
    return a == b


def compare_frames(written: pd.DataFrame, recomputed: pd.DataFrame, where: str) -> list[Difference]:
    """Every cell of ``written`` that the recomputed table does not have, rows matched by their
    key (model, reference, ...) and named by it: the order of rows is presentation, not data."""
    kind = kind_of(recomputed.columns, where)
    keys = list(ROW_KEYS[kind])

    def by_key(df: pd.DataFrame) -> dict[tuple, pd.Series]:
        return {tuple(_show(r[k]) for k in keys): r for _, r in df.iterrows()}

    old, new = by_key(written), by_key(recomputed)
    out = []
    for key, r in new.items():
        w = old.get(key)
        if w is None:
            out.append(Difference(where, _row_label(kind, r), "(row)", "absent", "present", key[0]))
            continue
        for col in SCHEMAS[kind]:
            if not _same(w[col], r[col]):
                shown = (_show(w[col]), _show(r[col]))
                out.append(Difference(where, _row_label(kind, r), col, *shown, key[0]))
    out += [
        Difference(where, _row_label(kind, w), "(row)", "present", "absent", key[0])
        for key, w in old.items()
        if key not in new
    ]
    return out


def _show(value: Any) -> str:
    return "(empty)" if pd.isna(value) else str(value)


def _cells(line: str) -> list[str] | None:
    """The cells of a Markdown (``| a | b |``) or LaTeX (``a & b \\\\``) table row."""
    if line.startswith("|") and line.endswith("|"):
        return [c.strip() for c in line[1:-1].split("|")]
    if line.endswith("\\\\") and " & " in line:
        return [c.strip() for c in line.removesuffix("\\\\").split(" & ")]
    return None


def compare_text(written: str, recomputed: str, where: str) -> list[Difference]:
    """A rendered table (Markdown or LaTeX) against its recomputed rendering. Lines are matched
    whole first (so rows in another order are no difference); a line left over is paired with the
    recomputed line of the same row (first cell), and each differing cell named by that row and
    its column's header; any other line by its number."""
    old, new = written.splitlines(), recomputed.splitlines()
    headers: list[list[str] | None] = []  # the header row above each recomputed line
    header = None
    for i, line in enumerate(new):
        if (
            _cells(line) is not None
            and new[i + 1 : i + 2]
            and new[i + 1].startswith(("|---", "\\midrule"))
        ):
            header = _cells(line)
        headers.append(header)
    spare = Counter(new)
    left_old = []
    for n, line in enumerate(old):
        if spare[line]:
            spare[line] -= 1
        else:
            left_old.append((n, line))
    left_new = []
    for i, line in enumerate(new):
        if spare[line]:
            spare[line] -= 1
            left_new.append(i)
    out = []
    for n, w in left_old:
        cells_w = _cells(w)
        match = next(
            (
                i
                for i in left_new
                if cells_w
                and (c := _cells(new[i]))
                and c[0] == cells_w[0]
                and len(c) == len(cells_w)
            ),
            None,
        )
        if match is None:
            out.append(Difference(where, f"line {n + 1}", "(text)", w, "(no such line)"))
            continue
        left_new.remove(match)
        head = headers[match]
        for j, (a, b) in enumerate(zip(cells_w, _cells(new[match]), strict=True)):
            if a != b:
                column = head[j] if head and j < len(head) else f"column {j + 1}"
                out.append(Difference(where, cells_w[0], column, a, b, cells_w[0]))
    out += [
        Difference(where, f"line {i + 1}", "(text)", "(no such line)", new[i]) for i in left_new
    ]
    return out


@dataclass
class Recomputed:
    table: str
    stage: str
    params: dict[str, Any]
    compared: list[str]  # the outputs compared
    differences: list[Difference] = field(default_factory=list)
    # Markdown/LaTeX cells of rows whose CSV cells differ (listed once, as the CSV's), by file
    rendered: dict[str, int] = field(default_factory=dict)
    note: str = ""  # what of it could be compared, where not everything

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def source(self) -> str:
        """What the written values were compared with."""
        return "the graded records" if self.stage in TABLE_STAGES else "their rebuild"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def text(self) -> str:
        seed, n = self.params.get("seed"), self.params.get("n_resamples")
        head = (
            f"recompute {self.table}\n  stage {self.stage} on its recorded inputs"
            + (f", seed {seed}" if seed is not None else "")
            + (f", {n} resamples" if n is not None else "")
            + (f"\n  {self.note}" if self.note else "")
        )
        if self.ok:
            names = ", ".join(Path(c).name for c in self.compared)
            return f"{head}\nok: {names} match {self.source}"
        lines = [head, f"{len(self.differences)} value(s) differ from {self.source}:"]
        # the values below their cell: full-precision floats would pass a terminal's width
        lines += [
            line
            for d in self.differences
            for line in (f"  {d.where()}", f"    written {d.written}, recomputed {d.recomputed}")
        ]
        if self.rendered:
            lines.append("  the same rows' rendered cells differ with them:")
            lines += [f"    {f}: {n} cell(s)" for f, n in sorted(self.rendered.items())]
        return "\n".join(lines)


def recompute(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Recomputed:
    """Build the table again with the stage, inputs and params its sidecar recorded, and compare."""
    from ..stages import tables as stages

    table = open_table(path, root)
    fn = getattr(stages, TABLE_STAGES[table.stage])
    outputs = {name: table.path(p) for name, p in table.prov["outputs"].items()}
    report = Recomputed(str(path), table.stage, dict(table.prov.get("params") or {}), [])
    inputs = table.inputs()
    unknown = sorted(set(inputs) - set(fn.contract.input_names))
    if unknown:
        raise DataError(
            f"{sidecar_path(table.csv)}: input {', '.join(unknown)} is not an input of stage "
            f"{table.stage} (a table built before its inputs were renamed); rebuild the table"
        )
    with tempfile.TemporaryDirectory(prefix="stillroom-recompute-") as tmp:
        scratch = {name: Path(tmp) / p.name for name, p in outputs.items()}
        metrics = fn(
            **inputs,
            # a plot is an image of the same numbers (its bytes are the walk's): not drawn again
            **{f"out_{n}": None if p.suffix == ".png" else str(p) for n, p in scratch.items()},
            params=report.params,
            log=lambda _: None,
        )
        for name, written in outputs.items():
            where = table.shown(written)
            if not written.is_file():
                diffs = [Difference(where, "(file)", "(file)", "gone", "written")]
            elif written.suffix == ".csv":
                diffs = compare_frames(load(written), load(scratch[name]), where)
            elif written.suffix in (".md", ".tex", ".html"):
                diffs = compare_text(written.read_text(), scratch[name].read_text(), where)
            else:
                continue
            report.compared.append(where)
            report.differences += diffs
    report.differences = _once(report) + compare_metrics(table, metrics)
    return report


def _once(report: Recomputed) -> list[Difference]:
    """Each cell once, as the CSV (the data of record) has it: a model's own value repeated on its
    rows against each reference is one cell, and a rendered row of a model whose CSV cells differ
    (its first cell the model, maybe marked: "merge-0.5 (chosen on dev)", "sft†") is counted in
    ``report.rendered``, not listed again."""
    csv = [d for d in report.differences if d.file.endswith(".csv")]
    changed = [re.compile(rf"{re.escape(d.key)}(\s|†|\*|$)") for d in csv]
    seen: dict[tuple[str, str, str, str, str], Difference] = {}
    kept = []
    for d in report.differences:
        if not d.file.endswith(".csv") and any(k.match(d.key) for k in changed):
            report.rendered[d.file] = report.rendered.get(d.file, 0) + 1
            continue
        same = (d.file, d.key, d.column, d.written, d.recomputed)
        if d.file.endswith(".csv") and same in seen:
            seen[same].more_rows += 1
            continue
        seen[same] = d
        kept.append(d)
    return kept


# ------------------------------------------- --recompute of what a table is built from, and metrics

# a job's own timing: the one metric a rerun cannot give again
UNREPEATABLE_METRICS = ("wall_s",)
SHORTENED = 80  # characters of a differing value shown


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A record or metrics as {"a.b.0.c": value}, so each difference is named by its path."""
    if isinstance(obj, list) and obj:
        obj = dict(enumerate(obj))
    if not isinstance(obj, Mapping) or not obj:
        return {prefix: obj}
    return {
        k: v
        for key, val in obj.items()
        for k, v in _flat(val, f"{prefix}.{key}".lstrip(".")).items()
    }


def _shorten(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= SHORTENED else text[: SHORTENED - 3] + "..."


def compare_metrics(art: Table, metrics: Mapping[str, Any] | None) -> list[Difference]:
    """The metrics each output's sidecar records against those the stage returned again (through
    JSON, as write_sidecars stored them), and its params against those rebuilt with: a sidecar no
    consumer hashed (the top one) edited by hand differs here."""
    again = json.loads(json.dumps(dict(metrics or {}), default=str))
    again = {k: v for k, v in _flat(again).items() if k.split(".")[0] not in UNREPEATABLE_METRICS}
    out = []
    for output in art.prov.get("outputs", {}).values():
        side = sidecar_path(art.path(output))
        if not side.is_file():
            continue  # a missing sidecar is the walk's problem
        prov, where = read_json(side), art.shown(side)
        # the job's outputs share one record: each must name the params the rebuild used, and
        # repeat their seed as the seed it reports
        if prov.get("params") != art.prov.get("params"):
            shown = (_shorten(prov.get("params")), _shorten(art.prov.get("params")))
            out.append(Difference(where, "record", "params", *shown))
        if prov.get("seed") != (seed := (prov.get("params") or {}).get("seed")):
            out.append(Difference(where, "record", "seed", _shorten(prov.get("seed")), str(seed)))
        written = _flat(prov.get("metrics") or {})
        written = {k: v for k, v in written.items() if k.split(".")[0] not in UNREPEATABLE_METRICS}
        for key in sorted(written.keys() | again.keys()):
            a, b = written.get(key, "(absent)"), again.get(key, "(absent)")
            if a != b:
                out.append(Difference(where, "metrics", key, _shorten(a), _shorten(b)))
    return out


def open_artifact(path: str | os.PathLike, root: str | os.PathLike | None = None) -> Table:
    """Any artifact with a sidecar, as a Table (its record, inputs and paths), or a clear error."""
    real = Path(root, path) if root and not Path(path).is_absolute() else Path(path)
    side = sidecar_path(real)
    if not side.is_file():
        raise DataError(f"{path}: no sidecar ({side}), so nothing records how to build it again")
    base = Path(root).resolve() if root else infer_root(real.resolve()) or Path.cwd()
    return Table(real, read_json(side), base)


def _kinds(path: Path) -> set[str]:
    return {r.get("kind", "") for r in iter_jsonl(path)}


def recomputable(art: Table) -> bool:
    """Built cheaply and deterministically from its inputs: a table, a dataset, a kernel grade
    (other grades are checked per model by --cell --regrade)."""
    if art.stage in TABLE_STAGES or art.stage == "dataset":
        return True
    return art.stage == "grade" and art.csv.is_file() and _kinds(art.csv) == {"kernel"}


def recompute_artifact(
    path: str | os.PathLike, root: str | os.PathLike | None = None
) -> Recomputed:
    """``path`` built again from its recorded inputs and params, and compared with what is written:
    a table cell by cell, a dataset or a kernel grade record by record; and its metrics."""
    art = open_artifact(path, root)
    if not recomputable(art):
        raise DataError(
            f"{path}: not a table, a dataset or a kernel grade (written by stage "
            f"'{art.stage}'), which --recompute builds again"
        )
    if art.stage in TABLE_STAGES:
        return recompute(path, root)
    from ..stages import dataset, grade

    params = dict(art.prov.get("params") or {})
    report = Recomputed(art.shown(art.csv), art.stage, params, [art.shown(art.csv)])
    with tempfile.TemporaryDirectory(prefix="stillroom-recompute-") as tmp:
        out = Path(tmp) / art.csv.name
        if art.stage == "dataset":
            metrics = dataset.build(
                **art.inputs(), out_dataset=str(out), params=params, log=lambda _: None
            )
            same = _dataset_row(art)
        else:
            metrics = grade.run(
                **art.inputs(), out_graded=str(out), params=params, log=lambda _: None
            )
            same, report.note = _kernel_grade(art)
        report.differences = compare_records(art, out, same) + compare_metrics(art, metrics)
    return report


def upstream_recomputable(walk: Any) -> list[str]:
    """The datasets and kernel grades the walk reached below its top artifact, each once: they
    are rebuilt like the table, since their hashes alone can be forged along the whole chain."""
    root = Path(walk.root)
    out = []
    for node in walk.nodes()[1:]:
        if node.repeat or node.stage not in ("dataset", "grade") or node.sha256 is None:
            continue
        if recomputable(open_artifact(node.path, root)):
            out.append(node.path)
    return list(dict.fromkeys(out))


def _dataset_row(art: Table) -> Any:
    """A rebuilt dataset row as the pipeline wrote it: its source file as recorded (relative to
    the run), not as the recompute named it."""

    def same(row: dict[str, Any]) -> dict[str, Any]:
        src = row.get("source_record")
        if src:
            row["source_record"] = {**src, "file": art.shown(src["file"])}
        return row

    return same


def _kernel_grade(art: Table) -> tuple[Any, str]:
    """What of a regraded kernel record must equal the written one. Its secret replay seeds come
    from the key file (``$STILLROOM_KERNEL_KEY_FILE``): with the key it was graded with, the whole
    grade but the measured speedup; without it (or with another) the cases differ, so only the
    verdict: correct, status and the rewards."""
    from ..kernels.validator import KEY_FILE_ENV, key_digest

    recorded = {
        ((r.get("grader") or {}).get("options") or {}).get("replay_key_sha256")
        for r in iter_jsonl(art.csv)
    }
    keyed = key_digest() is not None and recorded == {key_digest()}
    verdict = ("reward", "exec_reward", "rule_reward", "status")

    def same(row: dict[str, Any]) -> dict[str, Any]:
        g = row.get("grade") or {}
        details = g.get("details") or {}
        if keyed:
            details = {k: v for k, v in details.items() if k != "speedup"}
        else:
            details = {k: details.get(k) for k in verdict}
        return {**row, "grade": {**g, "details": details}}

    note = (
        f"regraded with the key it was graded with (${KEY_FILE_ENV}): every grade compared but "
        "its measured speedup"
        if keyed
        else f"regraded without the key it was graded with (${KEY_FILE_ENV}): the secret cases "
        "differ, so each verdict (correct, status, rewards) is compared, not the whole grade"
    )
    return same, note


def compare_records(art: Table, rebuilt: Path, same: Any) -> list[Difference]:
    """The written JSONL against the rebuilt one line by line, each seen through ``same`` (what of
    a record must repeat); a differing record named by its line and key, with its fields."""
    where = art.shown(art.csv)
    old = list(iter_jsonl(art.csv))
    new = list(iter_jsonl(rebuilt))
    out = []
    for n, (w, r) in enumerate(zip(old, new, strict=False), 1):
        w, r = same(w), same(r)
        if w == r:
            continue
        row = f"line {n} ({w.get('key') or w.get('id') or '?'})"
        for key in sorted(w.keys() | r.keys()):
            if w.get(key, "(absent)") != r.get(key, "(absent)"):
                a, b = _flat(w.get(key, "(absent)"), key), _flat(r.get(key, "(absent)"), key)
                for k in sorted(a.keys() | b.keys()):
                    if a.get(k, "(absent)") != b.get(k, "(absent)"):
                        shown = (_shorten(a.get(k, "(absent)")), _shorten(b.get(k, "(absent)")))
                        out.append(Difference(where, row, k, *shown))
    if len(old) != len(new):
        out.append(Difference(where, "(records)", "(count)", str(len(old)), str(len(new))))
    return out


# ------------------------------------------------------------------------------------- --cell


def _verdict(grade: Mapping[str, Any]) -> str:
    status = grade.get("status") or "ok"
    return ("correct" if grade.get("correct") else "wrong") if status == "ok" else status


@dataclass
class Record:
    file: str
    key: str
    prompt_id: str
    sample_index: int | None
    verdict: str
    grader: str
    effort: str | None = None
    teacher: str | None = None


def _record(file: str, r: Mapping[str, Any]) -> Record:
    g = r.get("grader") or {}
    return Record(
        file,
        r.get("key", ""),
        r.get("prompt_id", ""),
        r.get("sample_index"),
        _verdict(r.get("grade") or {}),
        f"{g.get('name', '?')} {g.get('version', '?')}",
        r.get("effort"),
        r.get("teacher"),
    )


def _cell_files(table: Table, model: str) -> tuple[list[str], str | None, bool]:
    """The graded files behind ``model``'s rows, the teacher whose records to keep (None: all),
    and whether they are a student's evaluation (True) or the teacher's own records."""
    inputs = table.inputs()
    graded = inputs.get("graded") or {}
    if table.stage in ("tables", "kernel_tables"):
        return [graded[model]], None, True
    if table.stage == "teacher_tables":
        return list(graded.values()), model, False
    if table.stage == "effort_tables" and model not in {n.rpartition("@")[0] for n in graded}:
        # the teacher's rows: "teacher", or "teacher (<name>)" when efforts have different ones
        name = model.partition("(")[2].rstrip(")") or None
        return list(inputs["teacher"].values()), name, False
    return [p for n, p in graded.items() if n.rpartition("@")[0] == model], None, True


def _regrade(file: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Grade ``records`` again as their grade stage did (its params, each kind's grader, hard
    limits per item); the records whose verdict changed."""
    from ..grading.dispatch import check_kinds, grader_info, item_limit
    from ..grading.workers import grade_many
    from ..stages.grade import Params, item

    side = sidecar_path(file)
    if not side.is_file():
        raise DataError(f"{file}: no sidecar, so its grader's options are unknown; cannot regrade")
    options = Params.parse(read_json(side).get("params") or {}, where=str(side))
    kinds = {r["kind"] for r in records}
    check_kinds(kinds)
    timeout_s = item_limit(kinds, options)
    grades = grade_many(
        [item(r) for r in records],
        workers=1,
        letters=options.letters,
        timeout_s=timeout_s,
        kernel=options.kernel.dump(),
        seed=options.seed,
        boxed=options.boxed,
    )
    changed = []
    for r, g in zip(records, grades, strict=True):
        now = _verdict(asdict(g))
        if now != _verdict(r["grade"]):
            info = grader_info(r["kind"], options, timeout_s)
            changed.append(
                {
                    "file": file,
                    "key": r.get("key"),
                    "prompt_id": r.get("prompt_id"),
                    "sample_index": r.get("sample_index"),
                    "recorded": _verdict(r["grade"]),
                    "regraded": now,
                    "recorded_grader": (r.get("grader") or {}).get("version"),
                    "grader": f"{info['name']} {info['version']}",
                }
            )
    return changed


class Verify:
    """Each file ``--cell`` reads or names, checked once against the sidecar chain: its bytes
    against its own sidecar (naming the records that changed) and against the hash its consumer
    recorded, its sidecar against the one the consumer was built with."""

    def __init__(self, table: Table):
        self.table = table
        self.auditor = Auditor(table.root)
        self.problems: list[Problem] = []
        self.checked: set[str] = set()

    def __call__(self, path: str, consumer: str, prov: Mapping[str, Any]) -> None:
        shown = self.table.shown(self.table.path(path))
        if shown in self.checked:
            return
        self.checked.add(shown)
        real = self.table.path(path)
        now, own = self.auditor.digest(real), self.auditor.sidecar(real)
        entry = next(
            (
                e
                for k in prov.get("inputs") or {}
                for e in _entries(prov, k)
                if self.table.shown(self.table.path(e["path"])) == shown
            ),
            None,
        )
        add = self.problems.append
        if now is None:
            add(Problem(shown, "missing", f"read for {consumer}, gone"))
        elif own is None:
            add(Problem(shown, "no provenance", f"read for {consumer}, it has no sidecar"))
        elif own.get("sha256") != now["sha256"]:
            add(Problem(shown, "modified", modified_detail(real, own, now["sha256"])))
        elif entry is None:
            add(Problem(shown, "no provenance", f"{consumer}'s sidecar does not name it"))
        elif entry.get("sha256") != now["sha256"]:
            detail = (
                f"{consumer} was built from it at {entry.get('sha256', '-')[:8]}, now "
                f"{now['sha256'][:8]} (its sidecar was rewritten to match)"
            )
            add(Problem(shown, "modified", detail))
        elif changed := self.auditor.sidecar_changed(consumer, entry):
            add(changed)


def _sidecar(path: Path) -> dict[str, Any] | None:
    side = sidecar_path(path)
    return read_json(side) if side.is_file() else None


def _entries(prov: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    entry = (prov.get("inputs") or {}).get(key)
    return [] if entry is None else entry if isinstance(entry, list) else [entry]


def lineage(table: Table, files: list[str], verify: Verify) -> dict[str, Any]:
    """From the graded evaluation files to the checkpoint that answered, through merges and
    training phases to the training rows, and from those to the graded teacher records (with the
    generation shards they were graded from)."""
    checkpoints: list[dict[str, Any]] = []
    datasets: list[dict[str, Any]] = []
    todo = []
    for f in files:
        graded = _sidecar(Path(f)) or {}
        for s in _entries(graded, "samples"):
            samples = _sidecar(table.path(s["path"])) or {}
            todo += [m["path"] for m in _entries(samples, "model")]
    seen: set[str] = set()
    while todo:
        ckpt = todo.pop(0)
        if ckpt in seen:
            continue
        seen.add(ckpt)
        prov = _sidecar(table.path(ckpt)) or {}
        made_from = {k: [e["path"] for e in _entries(prov, k)] for k in (prov.get("inputs") or {})}
        checkpoints.append({"path": ckpt, "stage": prov.get("stage"), "inputs": made_from})
        for key in ("tuned", "base", "adapter"):
            todo += made_from.get(key, [])
        datasets += [_dataset(table, d, verify, ckpt, prov) for d in made_from.get("dataset", [])]
    return {"student": bool(files), "checkpoints": checkpoints, "datasets": datasets}


def _dataset(
    table: Table, path: str, verify: Verify, ckpt: str, ckpt_prov: Mapping[str, Any]
) -> dict[str, Any]:
    """A training set's rows with the graded teacher records they came from (each file read and
    each generation shard named verified against its consumer's record)."""
    verify(path, ckpt, ckpt_prov)
    rows = list(iter_jsonl(table.path(path), required=("source_record",)))
    shards: dict[str, dict[str, dict[str, Any]]] = {}
    generated: dict[str, list[str]] = {}
    for file in sorted({r["source_record"]["file"] for r in rows}):
        verify(file, path, _sidecar(table.path(path)) or {})
        shards[file] = {rec["key"]: rec for rec in iter_jsonl(table.path(file), required=("key",))}
        graded = _sidecar(table.path(file)) or {}
        generated[file] = [s["path"] for s in _entries(graded, "samples")]
        for shard in generated[file]:
            verify(shard, file, graded)
    records = []
    for i, r in enumerate(rows):
        src = r["source_record"]
        rec = shards[src["file"]].get(src["key"])
        if rec is None:
            raise DataError(
                f"{path}: row {i + 1} names {src['key']} of {src['file']}, which has no such record"
            )
        records.append(
            {
                **asdict(_record(src["file"], rec)),
                "row": r.get("id"),
                "completion_tokens": rec.get("completion_tokens"),
                "generated": generated[src["file"]],
            }
        )
    counts = Counter((rec["teacher"], rec["effort"]) for rec in records)
    return {
        "path": path,
        "rows": len(rows),
        "by_teacher_effort": [
            {"teacher": t, "effort": e, "rows": n} for (t, e), n in sorted(counts.items())
        ],
        "graded_shards": sorted(shards),
        "records": records,
    }


@dataclass
class Cell:
    table: str
    model: str
    records: list[Record]
    regraded: list[dict[str, Any]] | None  # the changed verdicts; None when not regraded
    lineage: dict[str, Any]
    value: dict[str, Any] | None = None  # the cell's value from the records, beside the table's
    problems: list[Problem] = field(default_factory=list)  # records not matching their chain

    @property
    def ok(self) -> bool:
        return not self.regraded and not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "model": self.model,
            "ok": self.ok,
            "records": [asdict(r) for r in self.records],
            "verdicts": dict(Counter(r.verdict for r in self.records)),
            "graders": dict(Counter(r.grader for r in self.records)),
            "regraded": self.regraded,
            "value": self.value,
            "problems": [asdict(p) for p in self.problems],
            **self.lineage,
        }

    def text(self) -> str:
        d = self.to_dict()
        files = sorted({r.file for r in self.records})
        out = [f"{self.table}: {self.model}: {len(self.records)} graded records in"]
        out += [f"  {f}" for f in files]
        out += [
            "  verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(d["verdicts"].items())),
            "  graders: " + ", ".join(f"{k} ({v})" for k, v in sorted(d["graders"].items())),
        ]
        if v := self.value:
            out.append(
                f"  cell: {v['column']} = {v['correct']}/{v['records']} = {v['value']:.3f} "
                f"(correct / graded records; the table says {v['table']:.3f})"
            )
        out += [
            f"  {r.prompt_id} #{r.sample_index}"
            + (f" {r.teacher}@{r.effort}" if r.teacher else "")
            + f": {r.verdict}"
            for r in self.records[:SHOWN]
        ]
        if len(self.records) > SHOWN:
            out.append(f"  ... {len(self.records) - SHOWN} more (--json for all)")
        if self.regraded is not None:
            if self.regraded:
                out.append(f"regrade: {len(self.regraded)} verdict(s) changed:")
                out += [
                    f"  {c['file']}: {c['key']}: recorded {c['recorded']}, regraded "
                    f"{c['regraded']} ({c['grader']})"
                    for c in self.regraded
                ]
            else:
                out.append(f"regrade: all {len(self.records)} verdicts unchanged")
        for c in self.lineage["checkpoints"]:
            out.append(f"checkpoint {c['path']} [{c['stage']}]")
            out += [f"  <- {k} {p}" for k, paths in c["inputs"].items() for p in paths]
        for ds in self.lineage["datasets"]:
            out.append(
                f"training rows {ds['path']}: {ds['rows']} rows from "
                f"{len(ds['graded_shards'])} graded teacher shards"
            )
            out += [
                f"  {c['teacher']} @ {c['effort']}: {c['rows']} rows"
                for c in ds["by_teacher_effort"]
            ]
            for r in ds["records"][:3]:
                out.append(f"  {r['row']}: {r['verdict']}, {r['completion_tokens']} tokens")
                out.append(f"    <- graded {r['file']}")
                out += [f"    <- generated {g}" for g in r["generated"]]
        if not self.lineage["student"]:
            out.append("no checkpoint: these are the teacher's own records")
        elif not self.lineage["checkpoints"]:
            out.append("no checkpoint: the graded files' sidecars name no evaluated model")
        elif not self.lineage["datasets"]:
            out.append("no training rows: no checkpoint on this path was trained on a dataset")
        if self.problems:
            out.append(f"!! {len(self.problems)} record file(s) do not match their provenance:")
            out += problem_lines(self.problems)
        else:
            out.append("ok: every file read above matches its sidecar and its consumer's record")
        return "\n".join(out)


def cell(
    path: str | os.PathLike,
    model: str,
    root: str | os.PathLike | None = None,
    regrade: bool = False,
) -> Cell:
    table = open_table(path, root)
    df = load(table.csv)
    kind = kind_of(df.columns)
    key = ROW_KEYS[kind][0]
    models = list(dict.fromkeys(df[key].dropna()))
    if model not in models:
        raise DataError(f"{path}: no {key} '{model}' in this table; it has {', '.join(models)}")
    files, teacher, student = _cell_files(table, model)
    records: list[Record] = []
    regraded: list[dict[str, Any]] | None = [] if regrade else None
    verify = Verify(table)
    for file in files:
        verify(file, table.shown(table.csv), table.prov)
        mine = [
            r
            for r in iter_jsonl(file, required=("prompt_id", "grade"))
            if teacher is None or r.get("teacher") == teacher
        ]
        shown = table.shown(file)
        records += [_record(shown, r) for r in mine]
        if regraded is not None and mine:
            regraded += [{**c, "file": shown} for c in _regrade(file, mine)]
    walked = lineage(table, files if student else [], verify)
    value = _value(df[df[key] == model], records)
    if value and not math.isclose(value["value"], value["table"], rel_tol=REL_TOL, abs_tol=1e-12):
        detail = (
            f"{model}: the records give {value['column']} {value['correct']}/{value['records']} = "
            f"{value['value']:.4f}, the table says {value['table']:.4f}"
        )
        verify.problems.append(Problem(table.shown(table.csv), "differs", detail))
    return Cell(str(path), model, records, regraded, walked, value, verify.problems)


def _value(rows: pd.DataFrame, records: list[Record]) -> dict[str, Any] | None:
    """The model's accuracy as the correct share of its graded records, beside the table's, when
    its rows have one accuracy (a paired table; budget and effort rows each count a subset)."""
    accuracies = set(rows["accuracy"].dropna()) if "accuracy" in rows else set()
    if len(accuracies) != 1 or not records:
        return None
    correct = sum(r.verdict == "correct" for r in records)
    return {
        "column": "accuracy",
        "correct": correct,
        "records": len(records),
        "value": correct / len(records),
        "table": float(accuracies.pop()),
    }


def run(
    path: str,
    root: str | None = None,
    as_json: bool = False,
    recompute_table: bool = False,
    model: str | None = None,
    regrade: bool = False,
) -> int:
    """The CLI: with ``recompute_table`` the provenance walk and the rebuilt table's comparison
    (and of every dataset and kernel grade the walk reached),
    with ``model`` the drill-down into its rows; the report (or JSON) on stdout, each problem on
    stderr under --json (else their count: the report names them); 1 if the walk found a problem,
    a cell differs, a record does not match its chain or a verdict changed."""
    out: dict[str, Any] = {}
    texts, problems = [], []
    if recompute_table:
        walk = audit(path, root)
        out["audit"] = walk.to_dict()
        texts.append(format_tree(walk))
        problems += [f"{p.kind}: {p.path}: {p.detail}" for p in walk.problems]
        rec = recompute_artifact(path, root)
        out["recompute"] = rec.to_dict()
        texts.append(rec.text())
        problems += [f"differs: {d}" for d in rec.differences]
        upstream = [recompute_artifact(p, walk.root) for p in upstream_recomputable(walk)]
        out["recompute_upstream"] = [r.to_dict() for r in upstream]
        texts += [r.text() for r in upstream]
        problems += [f"differs: {d}" for r in upstream for d in r.differences]
    if model is not None:
        c = cell(path, model, root, regrade)
        out["cell"] = c.to_dict()
        texts.append(c.text())
        problems += [
            f"verdict changed: {ch['file']}: {ch['key']}: recorded {ch['recorded']}, regraded "
            f"{ch['regraded']}"
            for ch in c.regraded or []
        ]
        problems += [f"{p.kind}: {p.path}: {p.detail}" for p in c.problems]
    print(json.dumps(out, indent=2, default=str) if as_json else "\n\n".join(texts))
    if as_json:
        for p in problems:
            print(f"stillroom audit: {p}", file=sys.stderr)
    elif problems:  # the report above names each one: a terminal shows each once
        print(f"stillroom audit: {len(problems)} problem(s), each named above", file=sys.stderr)
    return 1 if problems else 0
