"""IFEval-style verifiable instructions: a registry of checkers with strict and loose scoring.

A problem's gold (its ``answer`` string, kind ``"instructions"``) is a JSON list of instruction
specs::

    [{"id": "length_words_max", "kwargs": {"n": 50}}, {"id": "case_lowercase"}]

``kwargs`` may be left out when an instruction takes none. Strict scoring checks the response as
is; loose scoring (as in IFEval) also accepts an instruction when it holds on the response with its
first line, last line or both removed, or with markdown ``*`` stripped. Only the text after the
last ``</think>`` is checked.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .formats import answer_text
from .result import Grade, Options


class InstructionError(ValueError):
    """A gold names an unknown instruction or gives it bad kwargs: a benchmark bug, not a model
    failure."""


@dataclass(frozen=True)
class Instruction:
    id: str
    check: Callable[..., bool]  # check(response, **kwargs) -> bool
    params: dict[str, type]  # kwarg name -> type; optional when check gives it a default


INSTRUCTIONS: dict[str, Instruction] = {}


def _instruction(id_: str, **params: type) -> Callable:
    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        INSTRUCTIONS[id_] = Instruction(id_, fn, params)
        return fn

    return register


_WORD = re.compile(r"\w+(?:['’-]\w+)*")  # "don't" and "well-known" are one word each
_BULLET = re.compile(r"^[ \t]*[*-][ \t]+\S", re.MULTILINE)
_DIVIDER = re.compile(r"^[ \t]*\*\*\*[ \t]*$", re.MULTILINE)


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _sentences(text: str) -> list[str]:
    # A sentence ends at . ! or ? followed by space, or at a blank line; chunks without a word
    # don't count.
    return [s for s in re.split(r"(?<=[.!?])\s+|\n\s*\n", text.strip()) if _WORD.search(s)]


def _has_word(text: str, word: str) -> bool:
    # Whole words (or phrases), any case: "cat" is not found in "concatenate".
    return re.search(rf"(?<!\w){re.escape(word.strip())}(?!\w)", text, re.IGNORECASE) is not None


@_instruction("length_words_max", n=int)
def length_words_max(response: str, n: int) -> bool:
    return len(_words(response)) <= n


@_instruction("length_words_min", n=int)
def length_words_min(response: str, n: int) -> bool:
    return len(_words(response)) >= n


@_instruction("length_sentences_max", n=int)
def length_sentences_max(response: str, n: int) -> bool:
    return len(_sentences(response)) <= n


@_instruction("length_sentences_min", n=int)
def length_sentences_min(response: str, n: int) -> bool:
    return len(_sentences(response)) >= n


@_instruction("keywords_include", keywords=list)
def keywords_include(response: str, keywords: list[str]) -> bool:
    return all(_has_word(response, k) for k in keywords)


@_instruction("keywords_forbidden", words=list)
def keywords_forbidden(response: str, words: list[str]) -> bool:
    return not any(_has_word(response, w) for w in words)


@_instruction("format_json")
def format_json(response: str) -> bool:
    text = response.strip()
    fenced = re.fullmatch(r"```(?:json)?[ \t]*\n?(.*?)\n?```", text, re.DOTALL | re.IGNORECASE)
    try:
        json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return False
    return True


@_instruction("case_lowercase")
def case_lowercase(response: str) -> bool:
    # islower() also needs at least one letter: "123" is not lowercase text
    return response.islower()


@_instruction("case_uppercase")
def case_uppercase(response: str) -> bool:
    return response.isupper()


@_instruction("bullets_exact", n=int)
def bullets_exact(response: str, n: int) -> bool:
    return len(_BULLET.findall(response)) == n


@_instruction("paragraphs_exact", n=int)
def paragraphs_exact(response: str, n: int) -> bool:
    # A *** line counts as a blank line, so either separator (or both together) splits paragraphs.
    text = _DIVIDER.sub("", response).strip()
    return len([p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]) == n


@_instruction("starts_with", phrase=str)
def starts_with(response: str, phrase: str) -> bool:
    return response.strip().lower().startswith(phrase.strip().lower())


@_instruction("ends_with", phrase=str)
def ends_with(response: str, phrase: str) -> bool:
    return response.strip().lower().endswith(phrase.strip().lower())


@_instruction("title", at_start=bool)
def title(response: str, at_start: bool = False) -> bool:
    """A title in <<double angular brackets>>; with at_start, the response must open with it."""
    pattern = re.compile(r"<<[^<>\n]*\w[^<>\n]*>>")
    return bool(pattern.match(response.lstrip()) if at_start else pattern.search(response))


@_instruction("no_commas")
def no_commas(response: str) -> bool:
    return "," not in response


@dataclass(frozen=True)
class InstructionSpec:
    id: str
    kwargs: dict[str, Any]


def _check_kwargs(inst: Instruction, kwargs: Any) -> None:
    if not isinstance(kwargs, dict):
        raise InstructionError(f"instruction {inst.id!r}: kwargs must be an object, got {kwargs!r}")
    try:
        inspect.signature(inst.check).bind("", **kwargs)
    except TypeError as e:
        raise InstructionError(f"instruction {inst.id!r}: bad kwargs {kwargs!r}: {e}") from None
    for name, value in kwargs.items():
        want = inst.params[name]
        if want is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        elif want is list:
            ok = (
                isinstance(value, list)
                and bool(value)
                and all(isinstance(v, str) and v.strip() for v in value)
            )
        elif want is str:
            ok = isinstance(value, str) and bool(value.strip())
        else:
            ok = isinstance(value, want)
        if not ok:
            what = {
                int: "a count >= 0",
                list: "a non-empty list of strings",
                str: "a non-empty string",
            }
            raise InstructionError(
                f"instruction {inst.id!r}: kwarg {name!r} must be "
                f"{what.get(want, want.__name__)}, got {value!r}"
            )


def parse_instructions(gold: str | Sequence[Any]) -> list[InstructionSpec]:
    """Validate a gold (JSON text or an already parsed list); raises InstructionError naming the
    culprit."""
    if isinstance(gold, str):
        try:
            gold = json.loads(gold)
        except ValueError as e:
            raise InstructionError(f"instruction gold is not valid JSON: {e}") from None
    if not isinstance(gold, list) or not gold:
        raise InstructionError(
            f"instruction gold must be a non-empty JSON list of specs, got {gold!r}"
        )
    specs = []
    for item in gold:
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("id"), str)
            or set(item) - {"id", "kwargs"}
        ):
            raise InstructionError(
                f"instruction spec must be {{'id': str, 'kwargs': {{...}}}}, got {item!r}"
            )
        inst = INSTRUCTIONS.get(item["id"])
        if inst is None:
            raise InstructionError(
                f"unknown instruction id {item['id']!r}; known: {', '.join(sorted(INSTRUCTIONS))}"
            )
        kwargs = item.get("kwargs", {})
        _check_kwargs(inst, kwargs)
        specs.append(InstructionSpec(inst.id, dict(kwargs)))
    return specs


# IFEval's instruction ids (google/IFEval) that one of the checks above implements, with the
# kwargs renamed; "relation" picks the bound of a length. IFEval's "less than N" is at most N - 1.
IFEVAL: dict[str, tuple[str, dict[str, str]]] = {
    "punctuation:no_comma": ("no_commas", {}),
    "change_case:english_lowercase": ("case_lowercase", {}),
    "change_case:english_capital": ("case_uppercase", {}),
    "detectable_format:json_format": ("format_json", {}),
    "detectable_format:title": ("title", {}),
    "detectable_format:number_bullet_lists": ("bullets_exact", {"n": "num_bullets"}),
    "keywords:existence": ("keywords_include", {"keywords": "keywords"}),
    "keywords:forbidden_words": ("keywords_forbidden", {"words": "forbidden_words"}),
    "startend:end_checker": ("ends_with", {"phrase": "end_phrase"}),
    "length_constraints:number_paragraphs": ("paragraphs_exact", {"n": "num_paragraphs"}),
    "length_constraints:number_words": ("length_words", {"n": "num_words"}),
    "length_constraints:number_sentences": ("length_sentences", {"n": "num_sentences"}),
}


def from_ifeval(
    ids: Sequence[str], kwargs: Sequence[Mapping[str, Any] | None]
) -> tuple[list, list]:
    """(our instruction specs, IFEval ids no check here implements) of one IFEval row."""
    specs, unsupported = [], []
    for iid, kw in zip(ids, kwargs, strict=True):
        kw = {k: v for k, v in (kw or {}).items() if v is not None}
        if iid not in IFEVAL:
            unsupported.append(iid)
            continue
        ours, names = IFEVAL[iid]
        args = {mine: kw[theirs] for mine, theirs in names.items()}
        if ours in ("length_words", "length_sentences"):
            less = kw.get("relation") == "less than"
            ours += "_max" if less else "_min"
            args["n"] -= less
        specs.append({"id": ours, **({"kwargs": args} if args else {})})
    return specs, unsupported


def loose_variants(response: str) -> list[str]:
    """IFEval's loose candidates: drop the first/last line (a preamble or sign-off), strip
    markdown '*'."""
    lines = response.split("\n")
    cut = [response, "\n".join(lines[1:]), "\n".join(lines[:-1]), "\n".join(lines[1:-1])]
    return [t for t in cut + [t.replace("*", "") for t in cut] if t.strip()]


@dataclass(frozen=True)
class InstructionResult:
    ids: tuple[str, ...]
    strict: tuple[bool, ...]  # per instruction, on the response as is
    loose: tuple[bool, ...]  # per instruction, on any loose variant
    status: str  # "ok", or "no_answer" when a <think> block is never closed

    @property
    def prompt_strict(self) -> bool:
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        return all(self.loose)

    @property
    def instruction_strict(self) -> float:
        return sum(self.strict) / len(self.strict)

    @property
    def instruction_loose(self) -> float:
        return sum(self.loose) / len(self.loose)

    def grade_fields(self) -> dict[str, Any]:
        """Keyword arguments for grading.Grade: correct is prompt-level strict."""
        return {"correct": self.prompt_strict, "extracted": None, "status": self.status}

    def details(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids),
            "strict": list(self.strict),
            "loose": list(self.loose),
            "prompt_strict": self.prompt_strict,
            "prompt_loose": self.prompt_loose,
            "instruction_strict": self.instruction_strict,
            "instruction_loose": self.instruction_loose,
        }


def grade_instructions(response: str, gold: str | Sequence[Any]) -> InstructionResult:
    specs = parse_instructions(gold)
    ids = tuple(s.id for s in specs)
    text = answer_text(response)
    if text is None:
        return InstructionResult(ids, (False,) * len(ids), (False,) * len(ids), "no_answer")
    variants = loose_variants(text)
    strict, loose = [], []
    for spec in specs:
        check = INSTRUCTIONS[spec.id].check
        strict.append(bool(text.strip()) and check(text, **spec.kwargs))
        loose.append(any(check(v, **spec.kwargs) for v in variants))
    return InstructionResult(ids, tuple(strict), tuple(loose), "ok")


def grade(response: str, gold: str, options: Options) -> Grade:
    result = grade_instructions(response, gold)
    return Grade(**result.grade_fields(), details=result.details())


def info(options: Options) -> dict[str, Any]:
    return {  # stillroom's IFEval-style checks: correct is prompt-level strict
        "name": "instructions",
        "version": importlib.metadata.version("stillroom"),
        "options": {"correct": "prompt-level strict", "loose": "IFEval variants, in details"},
    }
