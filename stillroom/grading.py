"""Answer grading: math answers through math-verify, multiple-choice answers by strict letter match.

Every grader returns a :class:`Grade`. A response with think tags is graded only on the text after its
last ``</think>``; a ``<think>`` left open after that point means the model never answered.
"""

from __future__ import annotations

import functools
import importlib.metadata
import multiprocessing
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .io import read_jsonl, write_jsonl

TIMEOUT_S = 5  # math-verify uses signal.alarm, so whole seconds, and only in a main thread
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None
    status: str  # "ok", "no_answer", "gold_unparseable" or "timeout"


GRADER_INFO: dict = {
    "grader": "stillroom.grading",
    "math_verify": importlib.metadata.version("math-verify"),
    "math": {
        "gold_parse": "math_verify.parse default config on '$gold$', then on the bare gold",
        "pred_extraction": ["LatexExtractionConfig(boxed_match_priority=0)", "ExprExtractionConfig()"],
        "verify": "math_verify.verify(gold, pred) defaults (float_rounding=6, strict=True)",
        "timeout_s": TIMEOUT_S,
    },
    "choice": "last '\\boxed{X}', 'answer: X' or 'answer is X' ('answer' any case, X case-sensitive)",
    "think": "only text after the last </think> is graded; an unclosed <think> is no_answer",
}

_NO_ANSWER = Grade(False, None, "no_answer")
_GOLD_BAD = Grade(False, None, "gold_unparseable")


def _answer_text(response: str) -> str | None:
    """The part of ``response`` to grade, or None when a ``<think>`` block is never closed."""
    end = response.rfind("</think>")
    if response.find("<think>", end + 1 if end >= 0 else 0) >= 0:
        return None
    return response[end + len("</think>"):] if end >= 0 else response


def _timeout() -> int | None:
    # SIGALRM can only be armed from the main thread; elsewhere math-verify raises unless disabled.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str, timeout: int | None) -> tuple:
    # '$...$' first: bare "3\sqrt{3}" parses as 3 and "2, 3" as 3, wrapped they parse whole.
    for text in (gold, f"${gold}$") if "$" in gold else (f"${gold}$", gold):
        try:
            parsed = parse(text, parsing_timeout=timeout, raise_on_error=True)
        except Exception:
            parsed = []
        if parsed:
            return tuple(parsed)
    return ()


def grade_math(response: str, gold: str) -> Grade:
    timeout = _timeout()
    try:
        gold_parsed = _parse_gold(gold, timeout)
        if not gold_parsed:
            return _GOLD_BAD
        text = _answer_text(response)
        if text is None:
            return _NO_ANSWER
        try:
            pred = parse(text, extraction_config=list(_PRED_CONFIG), parsing_timeout=timeout,
                         raise_on_error=True)
        except Exception:
            pred = []
    except TimeoutException:
        return Grade(False, None, "timeout")
    if not pred:
        return _NO_ANSWER
    extracted = next((p for p in pred if isinstance(p, str)), str(pred[0]))
    # Pair by pair, as verify() does itself, so that a timeout is seen rather than read as "wrong".
    timed_out = False
    for g in gold_parsed:
        for p in pred:
            try:
                if verify(g, p, timeout_seconds=timeout, raise_on_error=True):
                    return Grade(True, extracted, "ok")
            except TimeoutException:
                timed_out = True
            except Exception:
                pass
    return Grade(False, extracted, "timeout" if timed_out else "ok")


@functools.lru_cache(maxsize=32)
def _choice_regex(letters: str) -> re.Pattern:
    x = "[" + "".join(re.escape(c) for c in letters) + "]"
    boxed = rf"\\boxed\{{\s*(?:\\text(?:bf)?\{{)?\s*\(?\s*({x})\s*\)?\s*\}}"
    stated = rf"(?i:answer)\s*(?:\*\*)?\s*(?:(?i:is)\b|:)\s*:?\s*(?:\*\*)?\s*\(?\s*(?:\*\*)?\s*({x})(?!\w)"
    return re.compile(f"{boxed}|{stated}")


def grade_choice(response: str, gold: str, letters: str = "ABCD") -> Grade:
    """Letters are matched case-sensitively: with letters "ABCD", "answer is c" is no answer."""
    gold = gold.strip()
    if len(gold) != 1 or gold not in letters:
        return _GOLD_BAD
    text = _answer_text(response)
    matches = list(_choice_regex(letters).finditer(text)) if text is not None else []
    if not matches:
        return _NO_ANSWER
    letter = matches[-1].group(1) or matches[-1].group(2)
    return Grade(letter == gold, letter, "ok")


def grade(response: str, gold: str, kind: str, letters: str = "ABCD") -> Grade:
    if kind == "math":
        return grade_math(response, gold)
    if kind == "choice":
        return grade_choice(response, gold, letters)
    raise ValueError(f"unknown grading kind {kind!r}; expected 'math' or 'choice'")


def _grade_item(item: tuple[str, str, str], letters: str) -> Grade:
    return grade(item[0], item[1], item[2], letters)


def grade_many(items: Sequence[tuple[str, str, str]], workers: int = 1, letters: str = "ABCD",
               chunksize: int = 64) -> list[Grade]:
    """Grade (response, gold, kind) items in order; workers > 1 grades in forked processes."""
    items = list(items)
    bad = {kind for _, _, kind in items} - {"math", "choice"}
    if bad:
        raise ValueError(f"unknown grading kind {sorted(bad)[0]!r}; expected 'math' or 'choice'")
    work = functools.partial(_grade_item, letters=letters)
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    # fork, so each worker grades in its own main thread where math-verify's alarms work.
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.map(work, items, chunksize=chunksize)


def run(*, samples: str, out_graded: str, params: Mapping[str, Any], threads: int = 1,
        log: Callable[[str], None] = print, **_: Any) -> dict[str, Any]:
    """Stages 5 and 10: add a ``grade`` to every sample record (teacher or evaluation samples)."""
    rows = read_jsonl(samples, required=("key", "response", "answer", "kind"))
    # A sample whose request failed for good has no response: it is graded as no answer.
    grades = grade_many([(r["response"] or "", r["answer"], r["kind"]) for r in rows], workers=threads)
    for row, g in zip(rows, grades):
        row["grade"] = asdict(g)
    write_jsonl(out_graded, rows)
    status = Counter(g.status for g in grades)
    accuracy = {kind: round(sum(g.correct for r, g in zip(rows, grades) if r["kind"] == kind)
                            / sum(r["kind"] == kind for r in rows), 4)
                for kind in sorted({r["kind"] for r in rows})}
    log(f"graded {len(rows)} samples: accuracy {accuracy}, status {dict(status)}")
    return {"samples": len(rows), "correct": sum(g.correct for g in grades), "status": dict(status),
            "accuracy": accuracy, "grader": GRADER_INFO}
