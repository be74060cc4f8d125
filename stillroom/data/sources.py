"""Prompt sources: every configured ``sources`` entry as pool records (``iter_sources``).

The embedded default generates problems with checkable answers: two families stand in for
DeepMath (closed-form math) and OpenScienceReasoning (multiple choice with exactly one correct
letter). Every generated problem keeps its structured form in ``meta`` so the procedural teacher
can write a worked solution; ``worked_solution`` renders it at increasing levels of detail (the
teacher's effort levels) from a possibly wrong result. The other kinds: disturbed copies of
benchmark items (``echo``), JSONL files, hub or local datasets, and the kernel problems.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import string
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

from ..config import LOCAL_DATA, DatasetSpec, Source
from ..config.data import NAMES, OBJECTS, KernelSource, WhereRule, count_problem, distinct_problems
from ..grading.dispatch import KINDS
from ..grading.instructions import InstructionError, from_ifeval
from ..ids import prompt_id
from ..io import DataError, csv_rows, iter_jsonl, iter_lines, parse_row
from ..provenance.sidecars import Notes
from .records import record

if TYPE_CHECKING:
    import datasets

LETTERS = "ABCD"


def _math(rng: random.Random, hi: int) -> tuple[str, int, dict[str, Any]]:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    op = rng.choice(["add", "sub", "mul", "two_step", "linear"])
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    meta: dict[str, Any] = {"op": op, "a": a, "b": b, "name": name, "obj": obj}
    if op == "add":
        return (
            f"{name} has {a} {obj}. {name} gets {b} more {obj}. "
            f"How many {obj} does {name} have now?",
            a + b,
            meta,
        )
    if op == "sub":
        a, b = max(a, b), min(a, b)
        meta.update(a=a, b=b, friend=rng.choice([n for n in NAMES if n != name]))
        return (
            (
                f"{name} has {a} {obj} and gives {b} of them to {meta['friend']}. "
                f"How many {obj} does {name} have left?"
            ),
            a - b,
            meta,
        )
    if op == "mul":
        return (
            f"{name} buys {a} bags with {b} {obj} in each bag. "
            f"How many {obj} does {name} buy in total?",
            a * b,
            meta,
        )
    if op == "two_step":
        c = rng.randint(0, a + b)
        meta["c"] = c
        return (
            f"{name} has {a} {obj}, finds {b} more and then loses {c}. "
            f"How many {obj} does {name} have?",
            a + b - c,
            meta,
        )
    x = rng.randint(0, hi)
    meta.update(x=x, c=a * x + b)
    return f"Solve for x: {a}x + {b} = {a * x + b}.", x, meta


def _choice(rng: random.Random, hi: int) -> tuple[str, str, dict[str, Any]]:
    op = rng.choice(["largest", "smallest", "sum", "even"])
    extra: dict[str, int] = {}
    if op in ("largest", "smallest"):
        options = rng.sample(range(1, 10 * hi), 4)
        right = max(options) if op == "largest" else min(options)
        stem = f"Which number is the {op}?"
    elif op == "sum":
        a, b = rng.randint(1, hi), rng.randint(1, hi)
        right = a + b
        options = [right] + rng.sample(
            [right + d for d in (-3, -2, -1, 1, 2, 3) if right + d > 0], 3
        )
        rng.shuffle(options)
        stem = f"What is {a} + {b}?"
        extra = {"a": a, "b": b}
    else:
        odds = rng.sample(range(1, 10 * hi, 2), 3)
        right = rng.randrange(2, 10 * hi, 2)
        options = odds + [right]
        rng.shuffle(options)
        stem = "Which of these numbers is even?"
    letter = LETTERS[options.index(right)]
    listing = " ".join(f"({L}) {v}" for L, v in zip(LETTERS, options, strict=True))
    return f"{stem} {listing}", letter, {"op": op, "options": options, "right": right, **extra}


# Draws in a row that add no new prompt before the generator gives up: five times the draws the
# rarest prompt of a small space needs on average (~4e5 for choice at max_operand 2), so only a
# count at the very edge of what distinct_problems allows can end here.
STALL = 2_000_000


def generate(
    kind: str, source: str, count: int, seed: int, max_operand: int, where: str | None = None
) -> list[dict[str, Any]]:
    """``count`` distinct problems (by prompt id) of one family, deterministic under ``seed``.
    A count the family cannot give is refused before any draw; ``where`` (``"sources.0
    (arith)"``) starts the message, by default ``source 'NAME'``."""
    where = where or f"source '{source}'"
    problem = count_problem(kind, count, max_operand)
    if problem:
        raise DataError(f"{where}: {problem}")
    rng = random.Random(f"{source}:{seed}")
    make = {"arithmetic": _math, "choice": _choice}[kind]
    out: dict[str, dict[str, Any]] = {}
    attempts = stale = 0
    while len(out) < count:
        attempts += 1
        stale += 1
        if stale > STALL:
            raise DataError(
                f"{where}: only {len(out)} distinct prompts after {attempts - 1} draws, the last "
                f"{STALL} adding none, of the {distinct_problems(kind, max_operand)} that exist "
                f"(kind {kind}, max_operand {max_operand}); lower count ({count}) or raise "
                "max_operand"
            )
        prompt, answer, meta = make(rng, max_operand)
        rec = record(
            source, "math" if kind == "arithmetic" else "choice", prompt, str(answer), meta
        )
        if rec["prompt_id"] not in out:
            out[rec["prompt_id"]] = rec
            stale = 0
    return list(out.values())


def echo(
    source: str, benchmark_path: str, count: int, seed: int, where: str | None = None
) -> list[dict[str, Any]]:
    """``count`` copies of distinct benchmark items with case, punctuation and spacing disturbed;
    more than the benchmark holds is an error (``where`` starts its message).

    Stands in for the benchmark text that web-scraped pools carry; decontamination must drop them.
    """
    items = load_benchmark(benchmark_path, f"source '{source}'")
    if count > len(items):
        raise DataError(
            f"{where or f'source {source!r}'}: count {count} but the benchmark "
            f"{benchmark_path} has only {len(items)} items to copy; lower count"
        )
    rng = random.Random(f"{source}:{seed}")
    out = []
    for item in rng.sample(items, count):
        words = item["prompt"].split()
        noisy = " ".join(w.upper() if rng.random() < 0.2 else w.rstrip(".,?") for w in words)
        rec = record(
            source, item["kind"], f"Problem:  {noisy} ", item["answer"], item.get("meta", {})
        )
        out.append(rec)
    return out


BENCHMARK_KEYS = ("prompt", "answer", "kind")


def load_benchmark(
    path: str, what: str | None = None, allow_empty: bool = False, benchmark: str | None = None
) -> list[dict[str, Any]]:
    """Items of a benchmark (or ``jsonl`` source) file: one object a line with a known ``kind``
    and a non-empty ``prompt`` and ``answer`` (every kind is graded against its answer, so none
    may lack one), and at least one item unless ``allow_empty`` (a split of the pool, which may
    be configured empty). ``what`` (``"benchmark 'aime'"``) starts every error message.

    With ``benchmark`` (its name, which prompt ids are derived under) each item gets its
    ``prompt_id`` (a row's own, else the id of its normalised prompt), and two items with one id
    are an error naming both lines: evaluation pairs answers by id, so a benchmark lists each
    problem once."""
    return [row for _, row in benchmark_lines(path, what, allow_empty, benchmark)]


def benchmark_lines(
    path: str, what: str | None = None, allow_empty: bool = False, benchmark: str | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """``load_benchmark``'s items with their line numbers."""
    try:
        rows = _benchmark_rows(path, allow_empty)
        if benchmark is not None:
            _unique_ids(path, rows, benchmark)
        return rows
    except DataError as exc:
        if what:
            raise DataError(f"{what}: {exc}") from None
        raise


def _unique_ids(path: str, rows: list[tuple[int, dict[str, Any]]], benchmark: str) -> None:
    first: dict[Any, int] = {}
    for lineno, row in rows:
        own = "prompt_id" in row
        pid = row.setdefault("prompt_id", prompt_id(row["prompt"], benchmark))
        if isinstance(pid, bool) or not isinstance(pid, str | int):
            raise DataError(
                f"{path}:{lineno}: key 'prompt_id' should be str, got {type(pid).__name__}"
            )
        if pid in first:
            why = (
                f"key 'prompt_id' {pid!r} is also line {first[pid]}'s"
                if own
                else f"the prompt is also line {first[pid]}'s (prompt id {pid}, from the text "
                "with whitespace and Unicode normalised)"
            )
            raise DataError(
                f"{path}:{lineno}: {why}; a benchmark lists each problem once (drop one of "
                f"lines {first[pid]} and {lineno})"
            )
        first[pid] = lineno


def _benchmark_rows(path: str, allow_empty: bool) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for lineno, line in iter_lines(path):
        row = parse_row(
            path, lineno, line, BENCHMARK_KEYS, {"prompt": str, "answer": str, "kind": str}
        )
        if row["kind"] not in KINDS:
            raise DataError(
                f"{path}:{lineno}: key 'kind' must be one of {', '.join(KINDS)}, "
                f"got {row['kind']!r}"
            )
        for key in ("prompt", "answer"):
            if not row[key].strip():
                raise DataError(f"{path}:{lineno}: key '{key}' is empty; expected text")
        rows.append((lineno, row))
    if not rows and not allow_empty:
        empty = "the file is empty" if Path(path).stat().st_size == 0 else "only blank lines"
        raise DataError(
            f"{path}: no items ({empty}); expected one JSON object a line with keys "
            f"{', '.join(BENCHMARK_KEYS)}"
        )
    return rows


def worked_solution(meta: Mapping[str, Any], result: int | str, detail: int) -> tuple[str, str]:
    """(reasoning, final answer line) for a generated problem; ``detail`` 0..3 lengthens the
    reasoning."""
    op = meta["op"]
    if op in ("largest", "smallest", "sum", "even"):
        return _choice_solution(meta, str(result), detail)
    a, b, name, obj = meta["a"], meta["b"], meta.get("name", "They"), meta.get("obj", "items")
    if op == "add":
        steps = [
            f"{a} + {b} = {result}.",
            f"{name} starts with {a} {obj} and gets {b} more, so add them.",
            f"Check: {result} - {b} = {a}, which matches.",
            f"So {name} has {result} {obj}.",
        ]
    elif op == "sub":
        steps = [
            f"{a} - {b} = {result}.",
            f"{name} starts with {a} {obj} and gives away {b}, so subtract.",
            f"Check: {result} + {b} = {a}, which matches.",
            f"So {name} has {result} {obj} left.",
        ]
    elif op == "mul":
        steps = [
            f"{a} x {b} = {result}.",
            f"There are {a} bags of {b} {obj}, so multiply.",
            f"Check: {a} groups of {b} make {result}.",
            f"So {name} buys {result} {obj}.",
        ]
    elif op == "two_step":
        steps = [
            f"{a} + {b} = {a + b}, then {a + b} - {meta['c']} = {result}.",
            f"{name} first has {a} {obj} and finds {b}, then loses {meta['c']}.",
            f"Check: {result} + {meta['c']} = {a + b}, and {a + b} - {b} = {a}.",
            f"So {name} has {result} {obj}.",
        ]
    else:  # linear
        steps = [
            f"{a}x = {meta['c']} - {b} = {meta['c'] - b}, so x = {result}.",
            f"Subtract {b} from both sides, then divide by {a}.",
            f"Check: {a} x {result} + {b} = {a * int(result) + b}.",
            f"So x = {result}.",
        ]
    return by_detail(steps, detail), f"The answer is \\boxed{{{result}}}."


def by_detail(steps: list[str], detail: int) -> str:
    """steps = [core, explanation, check, conclusion]: 0 = core, 1 = +explanation, 2 = all, 3 = all
    twice checked."""
    core, explain, check, conclude = steps
    chosen = {0: [core], 1: [explain, core], 2: [explain, core, check, conclude]}.get(
        detail, [explain, core, check, "Checking once more: " + core, conclude]
    )
    return " ".join(chosen)


def _choice_solution(meta: Mapping[str, Any], letter: str, detail: int) -> tuple[str, str]:
    options, op = meta["options"], meta["op"]
    value = options[LETTERS.index(letter)]
    listing = ", ".join(f"{L} is {v}" for L, v in zip(LETTERS, options, strict=True))
    rule = {
        "largest": "the biggest value",
        "smallest": "the smallest value",
        "sum": "the value of the sum",
        "even": "the number divisible by 2",
    }[op]
    core = (
        f"{meta['a']} + {meta['b']} = {value}, option {letter}."
        if op == "sum"
        else f"{letter} is {value}."
    )
    steps = [
        core,
        f"We want {rule}. {listing}.",
        f"So the option is {letter}, which is {value}.",
        f"No other option fits, so {letter}.",
    ]
    return by_detail(steps, detail), f"The answer is \\boxed{{{letter}}}."


def iter_sources(
    specs: Sequence[Source],
    benchmarks: Mapping[str, str],
    seed: int,
    notes: Notes | None = None,
) -> Iterator[dict[str, Any]]:
    """All records of the configured sources, in config order; ``benchmarks``: name -> JSONL
    file."""
    for _, rec in iter_source_rows(specs, benchmarks, seed, notes=notes):
        yield rec


def iter_source_rows(
    specs: Sequence[Source],
    benchmarks: Mapping[str, str],
    seed: int,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``iter_sources``' records, each after where it came from (``source 'web' (web.jsonl:3)``),
    for a message that must point at the row; ``log`` gets each dataset source's row counts,
    ``notes`` the files and hub datasets read (for the job's provenance; None: not kept)."""
    notes = Notes() if notes is None else notes
    for i, spec in enumerate(specs):
        where = f"sources.{i} ({spec.name})"
        named = f"source '{spec.name}'"
        if spec.kind in ("arithmetic", "choice"):
            recs = generate(spec.kind, spec.name, spec.count, seed, spec.max_operand, where)
            origin = f"{named} (generated {spec.kind})"
            for rec in recs:
                yield origin, rec
        elif spec.kind == "echo":
            if spec.benchmark not in benchmarks:
                raise DataError(
                    f"source '{spec.name}': benchmark '{spec.benchmark}' "
                    "is not in config 'benchmarks'"
                )
            origin = f"{named} (a copy of a {spec.benchmark} item)"
            for rec in echo(spec.name, benchmarks[spec.benchmark], spec.count, seed, where):
                yield origin, rec
        elif spec.kind == "jsonl":
            notes.add_file(spec.path)
            for lineno, row in benchmark_lines(spec.path, named):
                meta = row.get("meta", {})
                rec = record(spec.name, row["kind"], row["prompt"], row["answer"], meta)
                yield f"{named} ({spec.path}:{lineno})", rec
        elif spec.kind == "dataset":
            for rec in dataset_records(spec, spec.name, log, notes):
                yield f"{named} ({spec.path} row {rec['meta']['row']})", rec
        else:
            from ..kernels.problemset import kernel_files

            for path in [spec.path] if spec.path else kernel_files(spec).values():
                notes.add_file(path)
            for rec in kernel_records(spec):
                yield f"{named} (problem {rec['meta']['problem']})", rec


def kernel_records(spec: KernelSource | Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """A ``kind: kernels`` source's problems as pool records. The problem is both the prompt and
    the gold: the validator runs it as the reference."""
    from ..kernels.problemset import kernel_problems

    spec = KernelSource.parse(spec, where="sources")
    for src, meta in kernel_problems(spec):
        yield record(spec.name, "kernel", src, src, meta)


def lettered(question: str, options: list[str]) -> tuple[str, str, dict[str, Any]]:
    """A multiple-choice prompt from ``options`` (the right one first), shuffled into letters by a
    seed taken from the question, so every run and every model sees the same order; the gold is
    the right option's letter."""
    order = list(range(len(options)))
    random.Random(hashlib.sha256(question.encode()).hexdigest()).shuffle(order)
    letters = string.ascii_uppercase[: len(options)]
    listing = "\n".join(
        f"({letter}) {options[j]}" for letter, j in zip(letters, order, strict=True)
    )
    right = letters[order.index(0)]
    return f"{question.strip()}\n\n{listing}", right, {"options": letters, "order": order}


def _passes(value: Any, rule: WhereRule) -> bool:
    return (
        (rule.min is None or value >= rule.min)
        and (rule.max is None or value <= rule.max)
        and (rule.equals is None or value == rule.equals)
        and (rule.in_ is None or value in rule.in_)
    )


def _no_value(value: Any) -> bool:
    """A row without a value for a field: null (a missing key reads as null), or a float NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


IFEVAL_FIELDS = ["instruction_id_list", "kwargs"]


def load_table(
    name: str,
    path: str,
    *,
    local: bool,
    split: str,
    revision: str | None,
    role: str,
    notes: Notes,
    subset: str | None = None,
) -> datasets.Dataset:
    """The rows of source ``name``: a hub dataset (by id, loaded in the job, never while the DAG
    is built) or a local parquet/JSONL/JSON/CSV file, noted in ``notes`` (the job's provenance) as
    ``role``.
    A missing, empty, undecodable or unreadable file, or a dataset the hub cannot give, is a
    DataError starting ``source 'NAME': PATH``; a bad byte's row or line is named."""
    import datasets

    try:
        if local:
            _check_local(path)
            ds = datasets.load_dataset(
                LOCAL_DATA[Path(path).suffix], data_files=path, split="train"
            )
        else:
            ds = datasets.load_dataset(path, subset, split=split, revision=revision)
    except DataError as exc:
        raise DataError(f"source '{name}': {exc}") from None
    except Exception as exc:
        # the hub, the network and every file format fail with their own exception types
        raise DataError(
            f"source '{name}': {path}: cannot load ({type(exc).__name__}: {exc})"
        ) from exc
    if not len(ds):
        raise DataError(f"source '{name}': {path}: no rows (split {split} is empty)")
    if local:
        notes.add_file(path)
    else:
        notes.add_dataset(path, role, subset=subset, split=split, revision=revision)
    return ds


def _check_local(path: str) -> None:
    """Our readers first, where the datasets library's cannot name what is wrong: a torn JSON
    line, a byte that is not UTF-8 by its row or line, and a file without rows as empty."""
    suffix = Path(path).suffix
    if not Path(path).exists():
        raise DataError(f"{path}: file not found")
    if suffix == ".jsonl" and not sum(1 for _ in iter_jsonl(path)):
        raise DataError(f"{path}: no rows (the file holds no JSON object)")
    if suffix == ".json":
        for _ in iter_lines(path):
            pass
    if suffix == ".csv" and not csv_rows(path):
        past = " past its header" if Path(path).stat().st_size else ""
        raise DataError(f"{path}: no rows (the file is empty{past})")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        meta = pq.read_metadata(path)
        if not meta.num_rows:
            raise DataError(
                f"{path}: no rows (the Parquet file is empty: columns "
                f"{', '.join(meta.schema.names)}, 0 rows)"
            )


def dataset_records(
    spec: DatasetSpec,
    name: str,
    log: Callable[[str], None] = print,
    notes: Notes | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows of a hub dataset or a local file (``load_table``) as pool records of source ``name``:
    ``prompt`` and ``answer`` name the fields, ``where`` filters rows, ``limit`` keeps the first N
    rows that pass. A row with no value (null, missing or NaN) for a ``where`` field does not
    pass; such rows are counted, and ``log`` gets the rows read, kept and filtered out once the
    rows are done. A ``where`` bound of another type than the value, a template placeholder other
    than $prompt, and an IFEval row with an instruction id or kwargs the grader does not know are
    errors naming the row; ``notes`` gets the file or hub dataset read (None: not kept)."""
    path = spec.path
    ds = load_table(
        name,
        path,
        local=spec.local,
        split=spec.split,
        revision=spec.revision,
        role=f"source:{name}",
        notes=Notes() if notes is None else notes,
        subset=spec.subset,
    )
    ifeval = spec.answer_kind == "ifeval"
    answer_fields = IFEVAL_FIELDS if ifeval else spec.choices or [spec.answer]
    extra = [spec.entry_point] if spec.entry_point else []
    for key in [spec.prompt, *answer_fields, *extra, *spec.where]:
        if key not in ds.column_names:
            raise DataError(
                f"source '{name}': {path} has no field '{key}' "
                f"(fields: {', '.join(ds.column_names)})"
            )
    kept = read = 0
    unset: dict[str, list[int]] = {}  # where field -> the rows without a value for it
    for i, row in enumerate(ds):
        read += 1
        if not _kept_by_where(spec, name, i, row, unset):
            continue
        prompt = row[spec.prompt]
        for key in [spec.prompt, *answer_fields, *extra]:
            value = row[key]
            if (
                value is None
                or not str(value).strip()
                or (key == spec.prompt and not isinstance(value, str))
            ):
                raise DataError(
                    f"source '{name}': {path} row {i}: field '{key}' is empty or not text "
                    f"({value!r:.40})"
                )
        if spec.prompt_template:
            # the template was checked with the config (DatasetSpec): $prompt only
            prompt = Template(spec.prompt_template).substitute(prompt=prompt)
        kind = spec.answer_kind
        if ifeval:
            try:
                gold = from_ifeval(row["instruction_id_list"], row["kwargs"])
            except InstructionError as exc:
                raise DataError(f"source '{name}': {path} row {i}: {exc}") from None
            except (KeyError, TypeError, ValueError) as exc:
                raise DataError(
                    f"source '{name}': {path} row {i}: instruction_id_list and kwargs do not "
                    f"match IFEval's layout ({type(exc).__name__}: {exc})"
                ) from None
            yield record(name, "instructions", prompt, json.dumps(gold), {"row": i})
        elif spec.choices:
            prompt, answer, meta = lettered(prompt, [str(row[k]).strip() for k in spec.choices])
            yield record(name, kind, prompt, answer, {"row": i, **meta})
        elif kind == "code":
            # the code grader's gold: the tests, and the function they call
            tests = row[spec.answer]
            gold = {"tests": list(tests) if isinstance(tests, list | tuple) else str(tests)}
            if spec.entry_point:
                gold["entry_point"] = str(row[spec.entry_point]).strip()
            yield record(name, kind, prompt, json.dumps(gold), {"row": i})
        else:
            answer = row[spec.answer]
            answer = str(answer) if kind == "kernel" else str(answer).strip()
            yield record(name, kind, prompt, answer, {"row": i})
        kept += 1
        if spec.limit and kept >= spec.limit:
            break
    unvalued = sorted({i for rows in unset.values() for i in rows})
    log(
        f"source '{name}': {path}: {kept} of the {read} rows read kept ({len(ds)} in all); "
        f"{read - kept} did not pass where"
        + (
            f", {len(unvalued)} of them for no value in "
            + ", ".join(f"'{k}' (rows {_some(rows)})" for k, rows in unset.items())
            if unvalued
            else ""
        )
    )


def _some(rows: list[int], shown: int = 5) -> str:
    return ", ".join(map(str, rows[:shown])) + (
        f", ... {len(rows)} in all" if len(rows) > shown else ""
    )


def _kept_by_where(
    spec: DatasetSpec, name: str, i: int, row: Mapping[str, Any], unset: dict[str, list[int]]
) -> bool:
    """Whether row ``i`` passes every ``where`` rule. A field without a value passes none (its
    row is noted in ``unset``); a value a bound cannot be compared with is a DataError."""
    passed = True
    for key, rule in spec.where.items():
        value = row[key]
        if _no_value(value):
            unset.setdefault(key, []).append(i)
            passed = False
            continue
        try:
            passed = _passes(value, rule) and passed
        except TypeError:
            raise DataError(
                f"source '{name}': {spec.path} row {i}: field '{key}' is "
                f"{type(value).__name__} {value!r:.40}, but where '{key}' "
                f"{rule.model_dump(by_alias=True)} compares it with a number; filter a "
                "numeric field, or use equals/in"
            ) from None
    return passed
