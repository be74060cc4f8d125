"""Grading in killable worker processes, each item under a limit of CPU time.

A grade must not depend on how busy the machine is, so the limit that judges an item is the CPU time
its worker spends on it (RLIMIT_CPU, set afresh before each item: the kernel stops the worker with
SIGXCPU however long the wall clock ran), and its item is graded ``"timeout"``, never ``"wrong"``.
Wall time is only a far backstop (``sandbox.backstop_s``) for a worker that blocks or is starved: a
worker past it is killed (SIGKILL) and replaced and its item tried again, up to ``BACKSTOP_TRIES``
times, then graded ``"harness"`` (the machine's fault, not the answer's). A worker that dies
otherwise (killed for memory, a segfault) leaves its item ``"crashed"``. The workers' temporary
files (a code run's box, the kernel validator's job directories) go in one directory of the pool's,
removed when grading ends, whatever killed a worker. Workers come from a ``forkserver``: a clean
process (no threads or locks inherited from the caller, unlike ``fork``) that has imported this
module once, so a replacement is a cheap fork rather than a fresh sympy import (as with ``spawn``).
As with ``spawn``, a script that grades with workers needs the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.base import DEFAULT_LETTERS
from ..sandbox import backstop_s
from . import math as math_grader
from .choice import _choice_regex
from .dispatch import check_kinds, grader
from .result import (
    BACKSTOP_TRIES,
    CRASHED,
    TIMED_OUT,
    TIMEOUT_S,
    Grade,
    Options,
    past_backstop,
)

# how a worker stopped by its CPU limit ends (bwrap-free: the worker is our own process)
_CPU_EXCEEDED = -signal.SIGXCPU


def _limit_cpu(cpu_s: float) -> None:
    """This process may spend ``cpu_s`` more CPU seconds (rounded up to whole seconds, RLIMIT_CPU's
    unit) before SIGXCPU ends it. Processes it starts inherit the limit as their own budget; the
    sandboxes set their own, lower, and the kernel fork server lifts it (it outlives an item)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))


def _serve(
    conn: multiprocessing.connection.Connection,
    options: Options,
    kinds: frozenset[str],
    cpu_s: float,
    scratch: str,
) -> None:
    """Worker loop: receive batches of (index, item), send back (index, Grade) one item at a time,
    so the parent always knows which item is running and since when; each item under ``cpu_s``
    CPU seconds. The graders of ``kinds`` warm up first (lm-eval's import takes seconds): not an
    item's time. Temporary files go under ``scratch``, the pool's."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it kills the workers
    tempfile.tempdir = scratch  # the pool removes it, even after a worker was killed
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU dumps no core
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
                _limit_cpu(cpu_s)
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
    def __init__(self, ctx: Any, *args: Any):
        """``args``: _serve's after the pipe."""
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve, args=(child, *args), daemon=True, name="stillroom-grader"
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
    tries = [0] * len(items)  # runs past the backstop, per item
    backstop = backstop_s(timeout_s)
    scratch = tempfile.mkdtemp(prefix="stillroom-grading-")
    args = (options, frozenset(item[2] for item in items), timeout_s, scratch)
    pool: list[_Worker | None] = [_Worker(ctx, *args) for _ in range(min(workers, len(items)))]

    def replace(k: int) -> None:
        """Kill worker k (SIGKILL: a hung C call ignores anything milder), hand back its unstarted
        items, and start a replacement if there is work left for one."""
        todo.extendleft(reversed(pool[k].pending))
        pool[k].stop(kill=True)
        pool[k] = _Worker(ctx, *args) if todo else None

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
            deadlines = [w.since + backstop for w in pool if w.pending]
            wait = max(0.0, min(deadlines) - now) if deadlines else None
            readable = multiprocessing.connection.wait([w.conn for w in pool], timeout=wait)
            now = time.monotonic()
            for k, w in list(enumerate(pool)):
                if w.conn in readable:
                    try:
                        msg = w.conn.recv()
                    except EOFError:  # died: out of CPU time, or killed for memory, a segfault
                        w.proc.join()
                        if not w.ready:
                            raise RuntimeError(
                                f"grader worker failed to start (exit code {w.proc.exitcode})"
                            ) from None
                        if w.pending:
                            cpu = w.proc.exitcode == _CPU_EXCEEDED
                            out[w.pending.popleft()] = TIMED_OUT if cpu else CRASHED
                            left -= 1
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
                elif w.pending and now >= w.since + backstop:  # blocked or starved: again
                    i = w.pending.popleft()
                    tries[i] += 1
                    if tries[i] < BACKSTOP_TRIES:
                        todo.appendleft(i)
                    else:
                        out[i], left = past_backstop(tries[i], backstop), left - 1
                    replace(k)
            pool = [w for w in pool if w is not None]
    finally:
        for w in filter(None, pool):
            w.stop(kill=bool(left))
        _remove_tree(scratch)
    return out  # type: ignore[return-value]


def _remove_tree(path: str) -> None:
    """Remove ``path``; the kernel jobs' directories are write-only (0o300) until opened up."""
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            if not os.path.islink(os.path.join(root, d)):
                os.chmod(os.path.join(root, d), 0o700)
    os.chmod(path, 0o700)
    shutil.rmtree(path, ignore_errors=True)


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

    ``workers >= 1``: in that many worker processes, each item under ``timeout_s`` CPU seconds (wall
    time only as a far backstop, ``sandbox.backstop_s``). ``workers=0``: in this process,
    bounded only by math-verify's alarms, which work only in the main thread. ``kernel``: the
    validator's options for kernel items.

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
