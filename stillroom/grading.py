"""Answer grading: math answers through math-verify, multiple-choice answers by strict letter match,
kernel answers by the kernel validator (execution reward x rule reward; correct means reward 1).

Every grader returns a :class:`Grade`. A response with think tags is graded only on the text after its
last ``</think>``; a ``<think>`` left open after that point means the model never answered.

Time limits. math-verify bounds its own work with ``signal.alarm``, which works only in a main thread and
only between Python bytecodes, and a pathological answer (``9^{9^{9^{9}}}``) still costs its full timeout
per parse/verify call. :func:`grade_many` therefore grades in worker processes with math-verify's alarms
off, and the parent enforces one hard wall-clock limit per item: a worker past it is killed (SIGKILL) and
replaced, and its item is graded ``"timeout"``, never ``"wrong"``. Workers come from a ``forkserver``: a
clean process (no threads or locks inherited from the caller, unlike ``fork``) that has imported this
module once, so a replacement is a cheap fork rather than a fresh sympy import (as with ``spawn``). As
with ``spawn``, a script that grades with workers needs the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import functools
import importlib.metadata
import multiprocessing
import multiprocessing.connection
import re
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import math_verify.grader
import math_verify.parser
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

from .io import read_jsonl, write_jsonl
from .kernels import VALIDATOR_DEFAULTS, evaluate
from .kernels.prompting import extract_code

TIMEOUT_S = (
    5  # per item in worker processes; per math-verify call (signal.alarm, whole s) in-process
)
FLOAT_ROUNDING = (
    6  # math_verify.verify's defaults, passed explicitly so that they are what gets recorded
)
STRICT = True
KINDS = ("math", "choice", "instructions", "code", "kernel")
CODE_TIMEOUT_S = (
    3.0  # the sandbox's own limit; below the pool's per-item limit so the sandbox reports it
)
KERNEL_MARGIN_S = (
    60.0  # above the candidate's limit: process start, the reference's run, the comparison
)
_PRED_CONFIG = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
_IN_WORKER = False  # set in pool workers, where the parent's kill is the time limit


@dataclass(frozen=True)
class Grade:
    correct: bool
    extracted: str | None
    # "ok" (right or wrong), "no_answer", "gold_unparseable" (a benchmark problem, not a wrong answer),
    # "timeout", or "crashed" (the worker died on this item, e.g. killed for memory)
    status: str
    details: dict | None = (
        None  # per-kind extras: loose instruction scores, the sandbox's run status
    )


GRADER_INFO: dict = {
    "grader": "stillroom.grading",
    "math_verify": importlib.metadata.version("math-verify"),
    "math": {
        "gold_parse": "math_verify.parse default config on '$gold$', then on the bare gold",
        "pred_extraction": [
            "LatexExtractionConfig(boxed_match_priority=0)",
            "ExprExtractionConfig()",
        ],
        "verify": f"math_verify.verify(gold, pred, float_rounding={FLOAT_ROUNDING}, strict={STRICT})",
        "timeout_s": TIMEOUT_S,
        "timeout": "hard wall-clock limit per item in a killable worker process (grade_many workers >= 1)",
    },
    "choice": "last '\\boxed{X}', 'answer: X' or 'answer is X' ('answer' any case, X case-sensitive)",
    "think": "only text after the last </think> is graded; an unclosed <think> is no_answer",
}

_NO_ANSWER = Grade(False, None, "no_answer")
_GOLD_BAD = Grade(False, None, "gold_unparseable")
_TIMED_OUT = Grade(False, None, "timeout")
_CRASHED = Grade(False, None, "crashed")


def grader_info(
    kind: str,
    *,
    letters: str = "ABCD",
    timeout_s: float | None = TIMEOUT_S,
    kernel: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What graded a record of ``kind``: name, version and options, recorded with every graded record.

    ``timeout_s`` None means graded in-process under math-verify's own per-call alarms."""
    limit = (
        {"timeout_s": TIMEOUT_S, "timeout": "signal, per math-verify call"}
        if timeout_s is None
        else {"timeout_s": timeout_s, "timeout": "hard, per item"}
    )
    if kind == "math":
        return {
            "name": "math-verify",
            "version": importlib.metadata.version("math-verify"),
            "options": {
                **limit,
                "float_rounding": FLOAT_ROUNDING,
                "strict": STRICT,
                "pred_extraction": GRADER_INFO["math"]["pred_extraction"],
                "sympy": importlib.metadata.version("sympy"),
            },
        }
    if kind == "choice":  # stillroom's own rule, so stillroom's version
        return {
            "name": "choice",
            "version": importlib.metadata.version("stillroom"),
            "options": {**limit, "letters": letters, "case_sensitive": True},
        }
    if kind == "instructions":  # stillroom's IFEval-style checks: correct is prompt-level strict
        return {
            "name": "instructions",
            "version": importlib.metadata.version("stillroom"),
            "options": {
                **limit,
                "correct": "prompt-level strict",
                "loose": "IFEval variants, in details",
            },
        }
    if kind == "code":
        return {
            "name": "code-sandbox",
            "version": importlib.metadata.version("stillroom"),
            "options": {
                **limit,
                "sandbox_timeout_s": CODE_TIMEOUT_S,
                "python": "-I -S -B, audit hook",
            },
        }
    if kind == "kernel":
        return {
            "name": "kernel-validator",
            "version": importlib.metadata.version("stillroom"),
            "options": {
                **limit,
                "validator": {**VALIDATOR_DEFAULTS, **(kernel or {})},
                "reward": "exec x rule",
                "triton": importlib.metadata.version("triton"),
            },
        }
    raise ValueError(f"unknown grading kind {kind!r}; expected one of {', '.join(KINDS)}")


def _answer_text(response: str) -> str | None:
    """The part of ``response`` to grade, or None when a ``<think>`` block is never closed."""
    end = response.rfind("</think>")
    if response.find("<think>", end + 1 if end >= 0 else 0) >= 0:
        return None
    return response[end + len("</think>") :] if end >= 0 else response


def _timeout() -> int | None:
    # SIGALRM can only be armed from the main thread; elsewhere math-verify raises unless disabled.
    # In a pool worker the parent kills a slow item, and an alarm would only cut its limit short.
    if _IN_WORKER or threading.current_thread() is not threading.main_thread():
        return None
    return TIMEOUT_S


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
            pred = parse(
                text,
                extraction_config=list(_PRED_CONFIG),
                parsing_timeout=timeout,
                raise_on_error=True,
            )
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
                if verify(
                    g,
                    p,
                    float_rounding=FLOAT_ROUNDING,
                    strict=STRICT,
                    timeout_seconds=timeout,
                    raise_on_error=True,
                ):
                    return Grade(True, extracted, "ok")
            except TimeoutException:
                timed_out = True
            except Exception:
                pass
    return Grade(False, extracted, "timeout" if timed_out else "ok")


@functools.lru_cache(maxsize=32)
def _choice_regex(letters: str) -> re.Pattern:
    if not letters or len(set(letters)) != len(letters) or any(c.isspace() for c in letters):
        raise ValueError(f"choice letters must be distinct non-space characters, got {letters!r}")
    x = "[" + "".join(re.escape(c) for c in letters) + "]"
    # Possessive \s*+: with plain \s* the runs between optional tokens split a long whitespace run in
    # O(n^k) ways ("Answer:" + 100 spaces took 3 s, 200 spaces minutes). Nothing after a run can start
    # with whitespace (letters never do), so giving none back never loses a match.
    boxed = rf"\\boxed\{{\s*+(?:\\text(?:bf)?\{{)?\s*+\(?\s*+({x})\s*+\)?\s*+\}}"
    stated = (
        rf"(?i:answer)\s*+(?:\*\*)?\s*+(?:(?i:is)\b|:)\s*+:?\s*+(?:\*\*)?\s*+\(?\s*+(?:\*\*)?\s*+"
        rf"({x})(?!\w)"
    )
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


def grade_kernel(
    response: str, problem_src: str, options: Mapping[str, Any] | None = None
) -> Grade:
    """The validator's dual reward for the code block of ``response``; the gold is the problem's source."""
    code = extract_code(response)
    if code is None:
        return Grade(
            False,
            None,
            "no_answer",
            details={"reasons": ["no ```python block after the reasoning"]},
        )
    result = evaluate(problem_src, code, **{**VALIDATOR_DEFAULTS, **(options or {})})
    timed_out = any(r.startswith("timed out") for r in result.reasons)
    return Grade(
        result.reward == 1.0, None, "timeout" if timed_out else "ok", details=asdict(result)
    )


def grade(
    response: str,
    gold: str,
    kind: str,
    letters: str = "ABCD",
    kernel: Mapping[str, Any] | None = None,
) -> Grade:
    if kind == "math":
        return grade_math(response, gold)
    if kind == "choice":
        return grade_choice(response, gold, letters)
    if kind == "instructions":
        from .instructions import grade_instructions

        result = grade_instructions(response, gold)
        return Grade(**result.grade_fields(), details=result.details())
    if kind == "code":
        from .code_eval import grade_code

        result = grade_code(response, gold, timeout_s=CODE_TIMEOUT_S)
        return Grade(
            **result.grade_fields(),
            details={
                "run": result.status,
                "seconds": round(result.duration_s, 3),
                "stderr_tail": result.stderr_tail[-500:],
            },
        )
    if kind == "kernel":
        return grade_kernel(response, gold, kernel)
    raise ValueError(f"unknown grading kind {kind!r}; expected one of {', '.join(KINDS)}")


_WARM_UP = (
    (r"\boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{(1, 3]}", "(1, 3]"),
    ("The answer is 42.", "42"),
)


def _serve(
    conn: multiprocessing.connection.Connection, letters: str, kernel: Mapping[str, Any] | None
) -> None:
    """Worker loop: receive batches of (index, item), send back (index, Grade) one item at a time, so
    the parent always knows which item is running and since when."""
    global _IN_WORKER
    _IN_WORKER = True
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C is the parent's to handle; it kills the workers
    # We do provide the time limit (the parent's kill); without these math-verify warns once per worker.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    for (
        response,
        gold,
    ) in _WARM_UP:  # first calls build math-verify's parsers (~0.3 s): not an item's time
        grade_math(response, gold)
    try:
        conn.send(None)  # ready: start-up time is not charged to the first item
        while True:
            for i, (response, gold, kind) in conn.recv():
                try:
                    g = grade(response, gold, kind, letters, kernel)
                except (
                    Exception
                ) as exc:  # a grader bug: raised in the parent, not hidden as a status
                    conn.send((i, exc))
                    return
                conn.send((i, g))
    except (EOFError, OSError):  # the parent closed the pipe: no more work
        return


class _Worker:
    def __init__(self, ctx: Any, letters: str, kernel: Mapping[str, Any] | None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, letters, kernel), daemon=True, name="stillroom-grader"
        )
        self.proc.start()
        child.close()
        self.ready = False
        self.pending: deque[int] = (
            deque()
        )  # indices sent and not yet graded; the first one is running
        self.since = (
            0.0  # when the running item started, as seen from here (never earlier than it did)
        )

    def stop(self, kill: bool = False) -> None:
        self.conn.close()  # an idle worker reads EOF and exits
        if kill:
            self.proc.kill()
        self.proc.join(None if kill else 5)
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()


def _grade_in_pool(
    items: list[tuple[str, str, str]],
    workers: int,
    letters: str,
    timeout_s: float,
    chunksize: int,
    kernel: Mapping[str, Any] | None,
) -> list[Grade]:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["__main__", __name__]
    )  # applies when the server starts (once per process)
    out: list[Grade | None] = [None] * len(items)
    todo, left = deque(range(len(items))), len(items)
    pool: list[_Worker | None] = [
        _Worker(ctx, letters, kernel) for _ in range(min(workers, len(items)))
    ]

    def replace(k: int) -> None:
        """Kill worker k (SIGKILL: a hung C call ignores anything milder), hand back its unstarted items,
        and start a replacement if there is work left for one."""
        todo.extendleft(reversed(pool[k].pending))
        pool[k].stop(kill=True)
        pool[k] = _Worker(ctx, letters, kernel) if todo else None

    try:
        while left:
            now = time.monotonic()
            for w in pool:
                if w.ready and not w.pending and todo:
                    # Smaller batches near the end, so that one worker is not left with a long tail.
                    n = max(1, min(chunksize, len(todo) // (2 * len(pool))))
                    batch = [todo.popleft() for _ in range(min(n, len(todo)))]
                    w.conn.send([(i, items[i]) for i in batch])
                    w.pending.extend(batch)
                    w.since = now
            deadlines = [w.since + timeout_s for w in pool if w.pending]
            readable = multiprocessing.connection.wait(
                [w.conn for w in pool],
                timeout=max(0.0, min(deadlines) - now) if deadlines else None,
            )
            now = time.monotonic()
            for k, w in list(enumerate(pool)):
                if w.conn in readable:
                    try:
                        msg = w.conn.recv()
                    except (
                        EOFError
                    ):  # died on its own (OOM killer, segfault): its item is "crashed"
                        if not w.ready:
                            raise RuntimeError(
                                f"grader worker failed to start (exit code {w.proc.exitcode})"
                            )
                        if w.pending:
                            out[w.pending.popleft()], left = _CRASHED, left - 1
                        replace(k)
                        continue
                    if msg is None:
                        w.ready = True
                        continue
                    i, g = msg
                    if isinstance(g, BaseException):
                        raise g
                    w.pending.popleft()
                    out[i], w.since, left = g, now, left - 1
                elif w.pending and now >= w.since + timeout_s:  # hung: its item is a timeout
                    out[w.pending.popleft()], left = _TIMED_OUT, left - 1
                    replace(k)
            pool = [w for w in pool if w is not None]
    finally:
        for w in filter(None, pool):
            w.stop(kill=bool(left))
    return out  # type: ignore[return-value]


def grade_many(
    items: Sequence[tuple[str, str, str]],
    workers: int = 1,
    letters: str = "ABCD",
    chunksize: int = 64,
    *,
    timeout_s: float = TIMEOUT_S,
    kernel: Mapping[str, Any] | None = None,
) -> list[Grade]:
    """Grade (response, gold, kind) items, results in input order.

    ``workers >= 1``: in that many worker processes, each item under a hard ``timeout_s`` wall-clock
    limit (the worker is killed and replaced; the item is graded "timeout"). ``workers=0``: in this
    process, bounded only by math-verify's alarms, which work only in the main thread. ``kernel``: the
    validator's options (device, trials, timeout_s) for kernel items."""
    items = list(items)
    bad = {kind for _, _, kind in items} - set(KINDS)
    if bad:
        raise ValueError(
            f"unknown grading kind {sorted(bad)[0]!r}; expected one of {', '.join(KINDS)}"
        )
    _choice_regex(letters)  # invalid letters fail here, not in a worker
    if workers <= 0 or not items:
        return [grade(*item, letters=letters, kernel=kernel) for item in items]
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    return _grade_in_pool(items, workers, letters, timeout_s, chunksize, kernel)


def run(
    *,
    samples: str,
    out_graded: str,
    params: Mapping[str, Any],
    threads: int = 1,
    log: Callable[[str], None] = print,
    **_: Any,
) -> dict[str, Any]:
    """Stages 5 and 10: add a ``grade`` and a ``grader`` to every sample record (teacher or evaluation samples).

    Params (optional): ``letters`` (multiple-choice letter set, default "ABCD"), ``grade_timeout_s``
    (hard per-item limit, default TIMEOUT_S), ``kernel`` (the validator's device, trials, timeout_s).
    ``threads`` worker processes grade (at least one)."""
    letters, timeout_s = params.get("letters", "ABCD"), params.get("grade_timeout_s", TIMEOUT_S)
    kernel = {**params.get("kernel", {}), "seed": params.get("seed", 0)}
    kernel = {k: v for k, v in kernel.items() if k in {*VALIDATOR_DEFAULTS, "seed"}}
    rows = read_jsonl(samples, required=("key", "response", "answer", "kind"))
    kinds = {r["kind"] for r in rows}
    # Each sandbox must time out (and say so) before the pool kills its grader.
    if "code" in kinds:
        timeout_s = max(timeout_s, CODE_TIMEOUT_S + 3)
    if "kernel" in kinds:
        timeout_s = max(
            timeout_s, kernel.get("timeout_s", VALIDATOR_DEFAULTS["timeout_s"]) + KERNEL_MARGIN_S
        )
    # A sample whose request failed for good has no response: it is graded as no answer.
    grades = grade_many(
        [(r["response"] or "", r["answer"], r["kind"]) for r in rows],
        workers=max(1, threads),
        letters=letters,
        timeout_s=timeout_s,
        kernel=kernel,
    )
    graders = {
        kind: grader_info(kind, letters=letters, timeout_s=timeout_s, kernel=kernel)
        for kind in kinds
    }
    for row, g in zip(rows, grades):
        row["grade"] = asdict(g)
        row["grader"] = graders[row["kind"]]
    write_jsonl(out_graded, rows)
    status = Counter(g.status for g in grades)
    accuracy = {
        kind: round(
            sum(g.correct for r, g in zip(rows, grades) if r["kind"] == kind)
            / sum(r["kind"] == kind for r in rows),
            4,
        )
        for kind in sorted({r["kind"] for r in rows})
    }
    # A wrong answer is a graded one that is not right; no answer, timeouts and unparseable golds are apart.
    counts = {
        "correct": sum(g.correct for g in grades),
        "wrong": sum(g.status == "ok" and not g.correct for g in grades),
        **{s: status[s] for s in ("no_answer", "timeout", "crashed", "gold_unparseable")},
    }
    log(f"graded {len(rows)} samples: accuracy {accuracy}, status {dict(status)}")
    if counts["gold_unparseable"]:
        log(
            f"warning: {counts['gold_unparseable']} samples have a gold answer that does not parse "
            "(graded incorrect, counted apart from wrong answers)"
        )
    return {
        "samples": len(rows),
        **counts,
        "status": dict(status),
        "accuracy": accuracy,
        "grader": GRADER_INFO,
        "graders": graders,
    }
