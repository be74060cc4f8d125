"""Where prompts come from: benchmarks, prompt sources, the held-out splits and decontamination."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from string import Template
from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer, model_validator

from .base import Name, Plain, PositiveInt, Section, tag

# A hub dataset's or model's id: a name, or owner/name (more, or starting at / or ., is local).
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(?:/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
# Local files a dataset spec may name instead of a hub id: suffix -> the datasets loader.
LOCAL_DATA = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def repo_path(path: str | Path, root: Path) -> str:
    """Config paths are relative to the repository root ``root``."""
    return str(path if Path(path).is_absolute() else root / path)


def local_spec(spec: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """A source or benchmark spec with its local file (or problem directory) resolved against the
    repository root ``root``."""
    if str(spec.get("path", "")).endswith(tuple(LOCAL_DATA)):
        return {**spec, "path": repo_path(spec["path"], root)}
    if spec.get("dir"):
        return {**spec, "dir": repo_path(spec["dir"], root)}
    return dict(spec)


AnswerKind = Literal["math", "choice", "code", "kernel", "ifeval"]
# the largest operand a generated source may draw
MAX_OPERAND = 1000
# kernels.max_input_elements halves no size below this (why 16: stillroom/kernels/scaling.py)
MIN_SCALED_SIZE = 16


# The generated sources' vocabularies: they fix how many distinct prompts a source kind can give,
# which the config checks against count before any job (data/sources.py draws from them).
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


def distinct_problems(kind: str, max_operand: int) -> int:
    """How many distinct prompts data/sources.py's ``_math`` (``arithmetic``) or ``_choice``
    (``choice``) can draw at ``max_operand`` (2 or more): each template's choices multiplied out
    (no two templates share a prompt). Exact: tests/data/test_sources.py draws every one at
    max_operand 2."""
    hi, people, things = max_operand, len(NAMES), len(OBJECTS)
    if kind == "arithmetic":
        add = mul = people * things * hi * hi
        # a >= b, and a friend of another name
        sub = people * (people - 1) * things * hi * (hi + 1) // 2
        two_step = people * things * hi * hi * (hi + 2)  # c in 0..a+b: sum of a+b+1 over a, b
        linear = hi * hi * (hi + 1)  # x in 0..hi
        return add + sub + mul + two_step + linear
    orders = 24  # the four options' orders
    pool = 10 * hi - 1  # range(1, 10 * hi)
    extreme = 2 * pool * (pool - 1) * (pool - 2) * (pool - 3)  # largest, smallest: ordered draws
    # sum: three wrong options of the deltas -3..3 that stay positive: 4 of them (4 choices) when
    # a + b is 2 (one pair), 5 (10 choices) when it is 3 (two pairs), 6 (20) otherwise
    total = 4 + 2 * 10 + 20 * (hi * hi - 3)
    odds, evens = 5 * hi, 5 * hi - 1
    even = odds * (odds - 1) * (odds - 2) // 6 * evens * orders
    return extreme + total * orders + even


# The most prompts one generated source may be asked for. The pool holds every record in memory
# (about 1 KB each) and a draw takes some 35 microseconds, so 10^7 is already ~10 GB and minutes;
# a count beyond it is a slip (1e15), not a recipe, whatever max_operand allows. Pools that large
# come from dataset sources.
MAX_GENERATED = 10_000_000


def count_problem(kind: str, count: int, max_operand: int) -> str | None:
    """Why a generated source cannot give ``count`` distinct prompts, or None when it can."""
    have = distinct_problems(kind, max_operand)
    if count > have:
        bigger = range(max_operand + 1, MAX_OPERAND + 1)
        enough = count <= MAX_GENERATED and next(
            (m for m in bigger if distinct_problems(kind, m) >= count), None
        )
        fix = f"raise max_operand to {enough} or lower count" if enough else "lower count"
        return (
            f"count {count} but only {have} distinct prompts are available "
            f"(kind {kind}, max_operand {max_operand}); {fix}"
        )
    if count > MAX_GENERATED:
        return (
            f"count {count} is more than the {MAX_GENERATED} prompts a generated source may "
            "give (every record is held in memory); use a dataset source for a pool that large"
        )
    return None


class WhereRule(Section):
    """A row filter on one field; only the given bounds apply."""

    min: float | None = Field(None, description="keep rows whose value is at least this")
    max: float | None = Field(None, description="keep rows whose value is at most this")
    equals: Plain = Field(None, description="keep rows whose value equals this")
    in_: list[Plain] | None = Field(
        None, alias="in", description="keep rows whose value is one of these"
    )

    @model_serializer(mode="wrap")
    def _given(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}

    @model_validator(mode="after")
    def _range(self) -> WhereRule:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min: {self.min:g} is above max ({self.max:g}): no row could pass")
        return self


class DatasetSpec(Section):
    """A hub dataset (loaded in a job, never while the DAG is built) or a local parquet/JSONL/CSV
    file."""

    path: str = Field(
        description="a hub dataset id, or a local .parquet, .jsonl, .json or .csv file (relative "
        "to "
        "the repository)"
    )
    subset: str | None = Field(None, description="the hub dataset's configuration (subset) name")
    split: str = Field("train", description="the split read")
    revision: str | None = Field(None, description="pin the dataset version")
    prompt: str = Field("prompt", description="field holding the prompt")
    answer: str = Field("answer", description="field holding the gold answer")
    answer_kind: AnswerKind = Field(
        "math",
        description="code: the answer field holds the tests (asserts, a list of them, or "
        "HumanEval's check(candidate)), run against the program of a response; kernel: prompt "
        "and answer are the problem file (KernelBench code); ifeval: google/IFEval rows "
        "(instruction_id_list, kwargs), graded as instructions",
    )
    entry_point: str | None = Field(
        None,
        description="answer_kind code: the field naming the function the tests call "
        "(HumanEval: entry_point)",
    )
    prompt_template: str | None = Field(
        None,
        pattern=r"\$prompt",
        description="what the model is asked, $prompt replaced by the prompt field (e.g. an "
        "instruction around HumanEval's function stub)",
    )
    where: dict[str, WhereRule] = Field(
        {}, description="row filters: field -> {min, max, equals, in}"
    )
    limit: PositiveInt | None = Field(
        None, description="keep the first N rows that pass where (null: all)"
    )
    choices: list[str] | None = Field(
        None,
        min_length=2,
        max_length=26,
        description="multiple choice from option fields, the right one first (GPQA: Correct "
        "Answer, Incorrect Answer 1-3): shuffled into letters per problem, the gold its letter",
    )

    @model_validator(mode="after")
    def _choices(self) -> DatasetSpec:
        if self.prompt_template is not None:
            try:
                Template(self.prompt_template).substitute(prompt="x")
            except (KeyError, ValueError) as exc:
                raise ValueError(
                    f"prompt_template: only $prompt may be substituted ({exc!r}; $$ is a literal $)"
                ) from None
        suffix = PurePosixPath(self.path).suffix
        if suffix and suffix not in LOCAL_DATA and not HUB_ID.fullmatch(self.path):
            raise ValueError(
                f"path: {self.path} is a local file of an unknown kind ({suffix}): local data is "
                f"{', '.join(LOCAL_DATA)}; a hub dataset is <owner>/<name>"
            )
        if self.choices and self.answer_kind != "choice":
            raise ValueError("choices: options are lettered for answer_kind: choice only")
        if self.entry_point and self.answer_kind != "code":
            raise ValueError("entry_point: for answer_kind: code only")
        if self.choices and len(set(self.choices)) != len(self.choices):
            raise ValueError(f"choices: each field may be listed once, got {self.choices}")
        return self

    @property
    def local(self) -> bool:
        return self.path.endswith(tuple(LOCAL_DATA))


class _Source(Section):
    name: Name = Field(
        description="the source's name: the prompts' source field, what heldout.sources lists"
    )


class _Generated(_Source):
    count: PositiveInt = Field(description="prompts generated")
    max_operand: Annotated[int, Field(ge=2, le=MAX_OPERAND)] = Field(
        12, description="operands are drawn from 1..max_operand"
    )


class ArithmeticSource(_Generated):
    """Generated closed-form math problems."""

    kind: Literal["arithmetic"] = Field(description="generated arithmetic problems")


class ChoiceSource(_Generated):
    """Generated multiple choice with exactly one right letter."""

    kind: Literal["choice"] = Field(description="generated multiple-choice problems")


class EchoSource(_Source):
    """Disturbed copies of benchmark items: the contamination decontamination must remove."""

    kind: Literal["echo"] = Field(description="disturbed copies of a benchmark's items")
    benchmark: str = Field(description="which benchmark to copy items from")
    count: PositiveInt = Field(description="copies made")


class JsonlSource(_Source):
    kind: Literal["jsonl"] = Field(description="prompts read from a JSONL file")
    path: str = Field(description="a JSONL file with prompt, answer and kind")


class DatasetSource(DatasetSpec):
    name: Name = Field(
        description="the source's name: the prompts' source field, what heldout.sources lists"
    )
    kind: Literal["dataset"] = Field(description="prompts read from a hub dataset or a local table")


class KernelSource(_Source):
    """KernelBench-style problem files: the project's own set, those in ``dir``, the rows of a
    JSONL ``path``, or a generated ``family`` (stillroom/kernels/family.py)."""

    kind: Literal["kernels"] = Field(description="KernelBench-style kernel problems")
    problems: Annotated[list[str], Field(min_length=1)] | None = Field(
        None, description="problem names: file stems, or the JSONL rows' name (default: all)"
    )
    dir: str | None = Field(
        None,
        description="a directory of problem files, KernelBench's layout (19_ReLU.py: Model, "
        "get_inputs, get_init_inputs) (default: the project's)",
    )
    path: str | None = Field(
        None,
        pattern=r"\.jsonl$",
        description="a JSONL file of problems, one a row, as KernelBench's dataset rows: code "
        "(the problem file's text, required), name (default: row<line>); level and problem_id "
        "are kept in meta",
    )
    max_input_elements: PositiveInt | None = Field(
        None,
        description="scale each problem down until get_inputs() holds at most this many "
        "elements in all (KernelBench's sizes are a GPU's): the module-level integer constants "
        "that size the inputs are halved, the largest first, none below "
        f"{MIN_SCALED_SIZE}, and the file is "
        "rewritten so prompt and reference are the scaled problem; meta.scaled keeps the "
        "original and scaled constants (null: files as written)",
    )
    family: Literal["elementwise"] | None = Field(
        None,
        description="a generated family instead of files: elementwise, unary and binary "
        "elementwise ops over a few shapes, each with a templated reference solution",
    )

    @model_validator(mode="after")
    def _unique(self) -> KernelSource:
        if self.problems and len(set(self.problems)) != len(self.problems):
            raise ValueError("problems: each problem may be listed once")
        if self.dir and self.path:
            raise ValueError("dir and path: give one (files of a directory, or JSONL rows)")
        if self.family and (self.dir or self.path):
            raise ValueError("family: a generated family has no dir or path; give one of them")
        return self


Source = Annotated[
    ArithmeticSource | ChoiceSource | EchoSource | JsonlSource | DatasetSource | KernelSource,
    Field(discriminator="kind"),
]
tag("arithmetic", "choice", "echo", "jsonl", "dataset", "kernels")
# the kinds the held-out splits are carved from
GENERATED = ("arithmetic", "choice", "kernels")


class Heldout(Section):
    size: int = Field(ge=0, description="0: no held-out split (evaluate on benchmarks instead)")
    dev_size: int = Field(
        0, ge=0, description="a dev split for choices (merge.select_on: dev), never reported"
    )
    sources: list[str] | None = Field(
        None,
        description="the sources both splits are carved from (by id hash); default: the "
        "generated ones",
    )


class Decontam(Section):
    ngram: Annotated[int, Field(ge=3, le=50)] = Field(
        13,
        description="n-gram length in normalised words: a pool prompt sharing one with a "
        "benchmark item is dropped",
    )
    audit_ngram: Annotated[int, Field(ge=3, le=50)] | None = Field(
        8,
        description="a second, shorter n-gram detector that drops nothing: the report lists the "
        "kept prompts it flags, with the matched item (null: off)",
    )
    ignore_common: PositiveInt | None = Field(
        None,
        description="ignore n-grams shared by more than this many benchmark items: boilerplate "
        "(imports, class headers), not contamination",
    )

    @model_validator(mode="after")
    def _shorter(self) -> Decontam:
        if self.audit_ngram is not None and self.audit_ngram >= self.ngram:
            raise ValueError(
                f"audit_ngram: {self.audit_ngram} should be shorter than ngram ({self.ngram}), "
                "to flag what the dropping detector keeps"
            )
        return self


class KernelBookColumns(Section):
    """Which column holds what: GPUMODE/KernelBook's names by default (its dataset card; the rows
    as public loaders read them: uuid, entry_point, python_code, triton_code, repo_name, licenses,
    ...)."""

    id: str = Field("uuid", description="a row's stable id")
    entry_point: str = Field("entry_point", description="the nn.Module class python_code defines")
    python_code: str = Field(
        "python_code",
        description="the module with get_inputs() and get_init_inputs() (returning [args, kwargs])",
    )
    triton_code: str = Field(
        "triton_code",
        description="Inductor's Triton for it: kernels, call(args), and class <entry_point>New",
    )
    reasoning: str | None = Field(
        None,
        description="a column of reasoning written before the code (KernelBook has none: the "
        "answer is then the code alone)",
    )


# Inductor specializes a module on its example's shapes (assert_size_stride): only cases that
# keep the shapes grade such a row, as a GPU would run it
KERNELBOOK_CASES = ["mixed_sign", "negative", "zero", "large"]


class KernelBookSource(Section):
    """SFT examples from KernelBook-style rows: each row's Triton is graded by the kernel reward
    against its own PyTorch module and kept only if it earns 1 (the others are dropped, with
    their reasons in the report)."""

    name: Name = Field(
        description="the source's name, in its errors and in the provenance of the table read"
    )
    kind: Literal["kernelbook"] = Field(description="rows of a KernelBook-style dataset")
    path: str = Field(description="a hub dataset id, or a local .jsonl or .parquet file")
    revision: str | None = Field(None, description="the hub dataset's pinned revision (required)")
    split: str = Field("train", description="the split read")
    columns: KernelBookColumns = Field(
        KernelBookColumns(), description="the dataset's column names"
    )
    limit: PositiveInt | None = Field(None, description="grade the first N rows only")
    cases: list[Literal["mixed_sign", "negative", "zero", "large"]] = Field(
        KERNELBOOK_CASES,
        description="the generated cases each row is graded on beyond the trials (no odd_shape: "
        "Inductor's code is specialized on the example's shapes)",
    )

    @property
    def local(self) -> bool:
        return self.path.endswith((".jsonl", ".parquet"))

    @model_validator(mode="after")
    def _pinned(self) -> KernelBookSource:
        if not self.local and not self.revision:
            raise ValueError(
                f"revision: {self.path} is a hub dataset (not a .jsonl or .parquet file): pin "
                "its revision (a commit sha), so the examples do not change under the run"
            )
        return self
