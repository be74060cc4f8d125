"""Grading in killable worker processes, each item under a hard wall-clock limit.

A worker past the limit is killed (SIGKILL) and replaced, and its item is graded ``"timeout"``,
never ``"wrong"``; a worker that dies on its own (killed for memory, a segfault) leaves its item
``"crashed"``. Workers come from a ``forkserver``: a clean process (no threads or locks inherited
from the caller, unlike ``fork``) that has imported this module once, so a replacement is a cheap
fork rather than a fresh sympy import (as with ``spawn``). As with ``spawn``, a script that grades
with workers needs the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.base import DEFAULT_LETTERS
from . import math as math_grader
from .choice import _choice_regex
from .dispatch import check_kinds, grader
from .result import CRASHED, TIMED_OUT, TIMEOUT_S, Grade, Options


def _serve(
    conn: multiprocessing.connection.Connection, options: Options, kinds: frozenset[str]
) -> None:
    """Worker loop: receive batches of (index, item), send back (index, Grade) one item at a time,
    so the parent always knows which item is running and since when. The graders of ``kinds``
    warm up first (lm-eval's import takes seconds): not an item's time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills the workers
    math_grader.use_worker_limits()
    math_grader.warm_up()
    try:
        for kind in sorted(kinds - {"math"}):
            getattr(grader(kind), "warm_up", lambda: None)()
    except Exception as exc:  # e.g. a missing model file: raised in the parent, named
        conn.send((None, exc))
        return
    try:
        conn.send(None)  # ready: start-up time is not charged to the first item
        while True:
            for i, item in conn.recv():
                try:
                    g = _grade_one(item, options)
                except Exception as exc:  # a grader bug: raised in the parent, not a status
                    conn.send((i, exc))
                    return
                conn.send((i, g))
    except (EOFError, OSError):  # the parent closed the pipe: no more work
        return


def _grade_one(item: tuple[str, ...], options: Options) -> Grade:
    """(response, gold, kind), or with a fourth element, the item's own multiple-choice letters."""
    response, gold, kind, *letters = item
    if letters:
        options = options.model_copy(update={"letters": letters[0]})
    return grader(kind).grade(response, gold, options)


class _Worker:
    def __init__(self, ctx: Any, options: Options, kinds: frozenset[str]):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, options, kinds), daemon=True, name="stillroom-grader"
        )
        self.proc.start()
        child.close()
        self.ready = False
        self.pending: deque[int] = deque()  # sent and not yet graded; the first one is running
        self.since = 0.0  # when the running item started, as seen from here (never earlier)

    def stop(self, kill: bool = False) -> None:
        self.conn.close()  # an idle worker reads EOF and exits
        if kill:
            self.proc.kill()
        self.proc.join(None if kill else 5)
        if self.proc.exitcode is None:
            self.proc.kill()
            self.proc.join()


def _grade_in_pool(
    items: list[tuple[str, ...]],
    workers: int,
    options: Options,
    timeout_s: float,
    chunksize: int,
) -> list[Grade]:
    ctx = multiprocessing.get_context("forkserver")
    # Applies when the server starts (once per process).
    ctx.set_forkserver_preload(["__main__", __name__])
    out: list[Grade | None] = [None] * len(items)
    todo, left = deque(range(len(items))), len(items)
    kinds = frozenset(item[2] for item in items)
    pool: list[_Worker | None] = [
        _Worker(ctx, options, kinds) for _ in range(min(workers, len(items)))
    ]

    def replace(k: int) -> None:
        """Kill worker k (SIGKILL: a hung C call ignores anything milder), hand back its unstarted
        items, and start a replacement if there is work left for one."""
        todo.extendleft(reversed(pool[k].pending))
        pool[k].stop(kill=True)
        pool[k] = _Worker(ctx, options, kinds) if todo else None

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
            wait = max(0.0, min(deadlines) - now) if deadlines else None
            readable = multiprocessing.connection.wait([w.conn for w in pool], timeout=wait)
            now = time.monotonic()
            for k, w in list(enumerate(pool)):
                if w.conn in readable:
                    try:
                        msg = w.conn.recv()
                    except EOFError:  # died on its own (OOM killer, segfault): "crashed"
                        if not w.ready:
                            raise RuntimeError(
                                f"grader worker failed to start (exit code {w.proc.exitcode})"
                            ) from None
                        if w.pending:
                            out[w.pending.popleft()], left = CRASHED, left - 1
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
                    out[w.pending.popleft()], left = TIMED_OUT, left - 1
                    replace(k)
            pool = [w for w in pool if w is not None]
    finally:
        for w in filter(None, pool):
            w.stop(kill=bool(left))
    return out  # type: ignore[return-value]


def grade_many(
    items: Sequence[tuple[str, ...]],
    workers: int = 1,
    letters: str = DEFAULT_LETTERS,
    chunksize: int = 64,
    *,
    timeout_s: float = TIMEOUT_S,
    kernel: Mapping[str, Any] | None = None,
    seed: int = 0,
    boxed: str = "last",
) -> list[Grade]:
    """Grade (response, gold, kind) items, results in input order; a fourth element, a choice
    item's own letters, stands for ``letters``.

    ``workers >= 1``: in that many worker processes, each item under a hard ``timeout_s``
    wall-clock limit. ``workers=0``: in this process, bounded only by math-verify's alarms, which
    work only in the main thread. ``kernel``: the validator's options for kernel items.

    An item repeated (a peaked model answers a problem the same way across samples) is graded once:
    every grader is a function of the item and the options (the kernel validator's inputs come
    from ``seed``)."""
    items = list(items)
    check_kinds({item[2] for item in items})
    for own in {letters, *(item[3] for item in items if len(item) > 3)}:
        _choice_regex(own)  # invalid letters fail here, not in a worker
    options = Options.parse(
        {"letters": letters, "kernel": dict(kernel or {}), "seed": seed, "boxed": boxed}
    )
    unique = list(dict.fromkeys(items))
    if workers <= 0 or not unique:
        grades = [_grade_one(item, options) for item in unique]
    elif not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    else:
        grades = _grade_in_pool(unique, workers, options, timeout_s, chunksize)
    by_item = dict(zip(unique, grades, strict=True))
    return [by_item[item] for item in items]
