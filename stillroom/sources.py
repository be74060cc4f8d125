"""Prompt sources for the embedded default: generated problems with checkable answers.

Two families stand in for the seed's DeepMath (closed-form math) and OpenScienceReasoning
(multiple choice with exactly one correct letter). Every problem keeps its structured form in
``meta`` so the procedural teacher can write a worked solution; ``worked_solution`` renders it
at increasing levels of detail (the teacher's effort levels) from a possibly wrong result.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .ids import normalize_prompt, prompt_id
from .io import DataError, read_jsonl

NAMES = ["Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jade", "Kai", "Lena"]
OBJECTS = [
    "apples",
    "pencils",
    "marbles",
    "stickers",
    "books",
    "coins",
    "cards",
    "shells",
    "cookies",
    "stamps",
    "beads",
    "toys",
]
LETTERS = "ABCD"


def _record(
    source: str, kind: str, prompt: str, answer: str, meta: dict[str, Any]
) -> dict[str, Any]:
    prompt = (
        prompt if kind == "kernel" else normalize_prompt(prompt)
    )  # folded whitespace would break code
    return {
        "prompt_id": prompt_id(prompt, source),
        "source": source,
        "kind": kind,
        "prompt": prompt,
        "answer": answer,
        "meta": meta,
    }


def _math(rng: random.Random, hi: int) -> tuple[str, int, dict[str, Any]]:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    op = rng.choice(["add", "sub", "mul", "two_step", "linear"])
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    meta: dict[str, Any] = {"op": op, "a": a, "b": b, "name": name, "obj": obj}
    if op == "add":
        return (
            f"{name} has {a} {obj}. {name} gets {b} more {obj}. How many {obj} does {name} have now?",
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
            f"{name} buys {a} bags with {b} {obj} in each bag. How many {obj} does {name} buy in total?",
            a * b,
            meta,
        )
    if op == "two_step":
        c = rng.randint(0, a + b)
        meta["c"] = c
        return (
            f"{name} has {a} {obj}, finds {b} more and then loses {c}. How many {obj} does {name} have?",
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
    listing = " ".join(f"({L}) {v}" for L, v in zip(LETTERS, options))
    return f"{stem} {listing}", letter, {"op": op, "options": options, "right": right, **extra}


def generate(
    kind: str, source: str, count: int, seed: int, max_operand: int = 12
) -> list[dict[str, Any]]:
    """``count`` distinct problems (by prompt id) of one family, deterministic under ``seed``."""
    rng = random.Random(f"{source}:{seed}")
    make = {"arithmetic": _math, "choice": _choice}[kind]
    out: dict[str, dict[str, Any]] = {}
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(
                f"source '{source}': only {len(out)} distinct problems after {attempts} draws; "
                f"raise max_operand or lower count ({count})"
            )
        prompt, answer, meta = make(rng, max_operand)
        rec = _record(
            source, "math" if kind == "arithmetic" else "choice", prompt, str(answer), meta
        )
        out.setdefault(rec["prompt_id"], rec)
    return list(out.values())


def echo(source: str, benchmark_path: str, count: int, seed: int) -> list[dict[str, Any]]:
    """Copies of benchmark items with case, punctuation and spacing disturbed.

    Stands in for the benchmark text that web-scraped pools carry; decontamination must drop them.
    """
    items = load_benchmark(benchmark_path)
    rng = random.Random(f"{source}:{seed}")
    out = []
    for item in rng.sample(items, min(count, len(items))):
        words = item["prompt"].split()
        noisy = " ".join(w.upper() if rng.random() < 0.2 else w.rstrip(".,?") for w in words)
        rec = _record(
            source, item["kind"], f"Problem:  {noisy} ", item["answer"], item.get("meta", {})
        )
        out.append(rec)
    return out


BENCHMARK_KEYS = ("prompt", "answer", "kind")
# math and choice are what the student is trained on; instructions (IFEval-style) and code are the
# off-target checks ("check what you didn't train on"); kernel is the kernel track's problem kind.
BENCHMARK_KINDS = ("math", "choice", "instructions", "code", "kernel")


def load_benchmark(path: str) -> list[dict[str, Any]]:
    rows = read_jsonl(
        path, required=BENCHMARK_KEYS, types={"prompt": str, "answer": str, "kind": str}
    )
    for i, row in enumerate(rows, 1):
        if row["kind"] not in BENCHMARK_KINDS:
            raise DataError(
                f"{path}:{i}: key 'kind' must be one of {', '.join(BENCHMARK_KINDS)}, got {row['kind']!r}"
            )
    return rows


def worked_solution(meta: Mapping[str, Any], result: int | str, detail: int) -> tuple[str, str]:
    """(reasoning, final answer line) for a generated problem; ``detail`` 0..3 lengthens the reasoning."""
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
    """steps = [core, explanation, check, conclusion]: 0 = core, 1 = +explanation, 2 = all, 3 = all twice checked."""
    core, explain, check, conclude = steps
    chosen = {0: [core], 1: [explain, core], 2: [explain, core, check, conclude]}.get(
        detail, [explain, core, check, "Checking once more: " + core, conclude]
    )
    return " ".join(chosen)


def _choice_solution(meta: Mapping[str, Any], letter: str, detail: int) -> tuple[str, str]:
    options, op = meta["options"], meta["op"]
    value = options[LETTERS.index(letter)]
    listing = ", ".join(f"{L} is {v}" for L, v in zip(LETTERS, options))
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
    specs: list[Mapping[str, Any]], benchmarks: Mapping[str, str], seed: int
) -> Iterator[dict[str, Any]]:
    """All records of the configured sources, in config order."""
    for spec in specs:
        kind, name = spec["kind"], spec["name"]
        if kind in ("arithmetic", "choice"):
            yield from generate(kind, name, spec["count"], seed, spec.get("max_operand", 12))
        elif kind == "echo":
            if spec["benchmark"] not in benchmarks:
                raise DataError(
                    f"source '{name}': benchmark '{spec['benchmark']}' is not in config 'benchmarks'"
                )
            yield from echo(name, benchmarks[spec["benchmark"]], spec["count"], seed)
        elif kind == "jsonl":
            for row in load_benchmark(spec["path"]):
                yield _record(name, row["kind"], row["prompt"], row["answer"], row.get("meta", {}))
        elif kind == "dataset":
            yield from dataset_records(spec)
        elif kind == "kernels":
            yield from kernel_records(spec)
        else:
            raise DataError(f"source '{name}': unknown kind '{kind}'")


def kernel_files(spec: Mapping[str, Any]) -> dict[str, Path]:
    """The problem files of a ``kind: kernels`` source by name: the project's own set
    (``stillroom/kernels/problems``, each with a reference solution) or those in ``dir``; ``problems``
    names a subset."""
    from .kernels import PROBLEMS_DIR

    name, root = spec["name"], Path(spec.get("dir") or PROBLEMS_DIR)
    available = {p.stem: p for p in sorted(root.glob("*.py")) if not p.name.startswith("_")}
    if not available:
        raise DataError(f"source '{name}': no problem files (*.py) in {root}")
    wanted = spec.get("problems") or sorted(available)
    missing = [w for w in wanted if w not in available]
    if missing:
        raise DataError(
            f"source '{name}': no problem file for {missing} in {root} (have {len(available)})"
        )
    return {stem: available[stem] for stem in wanted}


def kernel_records(spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """KernelBench-style problem files (a ``Model``, ``get_inputs``, ``get_init_inputs``). The file is both
    the prompt and the gold (the validator runs it as the reference), kept verbatim: folding whitespace
    would break the Python."""
    from .kernels import SOLUTIONS_DIR

    for stem, path in kernel_files(spec).items():
        src = path.read_text(encoding="utf-8")
        meta = {"problem": stem}
        if not spec.get("dir") and (SOLUTIONS_DIR / f"{stem}.py").exists():
            meta["solution"] = stem
        yield _record(spec["name"], "kernel", src, src, meta)


LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _passes(value: Any, rule: Mapping[str, Any]) -> bool:
    return (
        ("min" not in rule or value >= rule["min"])
        and ("max" not in rule or value <= rule["max"])
        and ("equals" not in rule or value == rule["equals"])
        and ("in" not in rule or value in rule["in"])
    )


def dataset_records(spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Rows of a hub dataset (by id, loaded in the job, never at DAG build) or of a local parquet/JSONL/CSV
    file, mapped to pool records: ``prompt`` and ``answer`` name the fields, ``where`` filters rows
    (``{field: {min, max, equals, in}}``), ``limit`` keeps the first N rows that pass."""
    import datasets

    name, path = spec["name"], spec["path"]
    suffix = Path(path).suffix
    if suffix in LOCAL_SUFFIXES:
        if not Path(path).exists():
            raise DataError(f"source '{name}': {path}: file not found")
        ds = datasets.load_dataset(LOCAL_SUFFIXES[suffix], data_files=path, split="train")
    else:
        ds = datasets.load_dataset(
            path,
            spec.get("subset"),
            split=spec.get("split", "train"),
            revision=spec.get("revision"),
        )
    fields = {"prompt": spec.get("prompt", "prompt"), "answer": spec.get("answer", "answer")}
    where = spec.get("where", {})
    for key in [*fields.values(), *where]:
        if key not in ds.column_names:
            raise DataError(
                f"source '{name}': {path} has no field '{key}' (fields: {', '.join(ds.column_names)})"
            )
    kept = 0
    for i, row in enumerate(ds):
        if not all(_passes(row[k], rule) for k, rule in where.items()):
            continue
        prompt, answer = row[fields["prompt"]], row[fields["answer"]]
        if (
            not isinstance(prompt, str)
            or not prompt.strip()
            or answer is None
            or str(answer).strip() == ""
        ):
            raise DataError(
                f"source '{name}': {path} row {i}: field '{fields['prompt']}' or '{fields['answer']}' "
                f"is empty or not text ({prompt!r:.40}, {answer!r:.40})"
            )
        kind = spec.get("answer_kind", "math")
        yield _record(
            name, kind, prompt, str(answer) if kind == "kernel" else str(answer).strip(), {"row": i}
        )
        kept += 1
        if spec.get("limit") and kept >= spec["limit"]:
            return


def fetch_benchmark(
    *, out_benchmark: str, params: Mapping[str, Any], log: Callable[[str], None] = print, **_: Any
) -> dict[str, Any]:
    """Materialise a benchmark given as a dataset spec (hub id or file) as a JSONL of prompt/answer/kind."""
    from .io import write_jsonl

    rows = [
        {
            "prompt_id": r["prompt_id"],
            "prompt": r["prompt"],
            "answer": r["answer"],
            "kind": r["kind"],
        }
        for r in dataset_records({**params["spec"], "name": params["name"]})
    ]
    if not rows:
        raise DataError(f"benchmark '{params['name']}': no rows from {params['spec']['path']}")
    write_jsonl(out_benchmark, rows)
    log(f"benchmark {params['name']}: {len(rows)} items from {params['spec']['path']}")
    return {"items": len(rows)}
