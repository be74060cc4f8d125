"""A daily output-token budget shared by every shard job of a teacher: generation stops once the
day's output tokens are spent.

The ledger is a small JSON file guarded by ``flock``: a request is admitted only if its worst case
(``max_tokens``) fits beside what was spent and what is in flight; when it returns, the reservation
is replaced by the tokens actually used. The day starts at ``reset_hour_utc``. Reservations of
processes on this host that died (SIGKILL mid-request) are released when the ledger is next read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


class BudgetExhausted(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Budget:
    def __init__(self, path: str | os.PathLike, daily_tokens: int, reset_hour_utc: int = 0):
        if daily_tokens < 1:
            raise ValueError(f"budget: daily_output_tokens must be >= 1, got {daily_tokens}")
        self.path, self.daily, self.reset_hour = Path(path), int(daily_tokens), int(reset_hour_utc)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _period(self, now: datetime | None = None) -> tuple[str, datetime]:
        """(the budget day's name, when it ends) for ``now``."""
        now = now or datetime.now(UTC)
        start = now.replace(hour=self.reset_hour, minute=0, second=0, microsecond=0)
        if now < start:
            start -= timedelta(days=1)
        return start.date().isoformat(), start + timedelta(days=1)

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[dict[str, Any]]:
        with open(self.path.with_name(self.path.name + ".lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = json.loads(self.path.read_text()) if self.path.exists() else {}
                day, _ = self._period()
                if state.get("day") != day:
                    state = {"day": day, "spent": 0, "requests": 0, "reserved": {}}
                host = socket.gethostname()
                state["reserved"] = {
                    o: n
                    for o, n in state["reserved"].items()
                    if not o.startswith(host + ":") or _alive(int(o.rsplit(":", 1)[1]))
                }
                yield state
                tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(state, sort_keys=True))
                os.replace(tmp, self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def reserve(self, tokens: int) -> bool:
        """Admit a request whose worst case is ``tokens`` output tokens, if it fits today."""
        with self._ledger() as state:
            if state["spent"] + sum(state["reserved"].values()) + tokens > self.daily:
                return False
            state["reserved"][self.owner] = state["reserved"].get(self.owner, 0) + tokens
            return True

    def settle(self, reserved: int, used: int) -> None:
        """Replace a reservation by the tokens the request really used."""
        with self._ledger() as state:
            left = state["reserved"].get(self.owner, 0) - reserved
            if left > 0:
                state["reserved"][self.owner] = left
            else:
                state["reserved"].pop(self.owner, None)
            state["spent"] += used
            state["requests"] += 1

    def status(self) -> dict[str, Any]:
        with self._ledger() as state:
            _, ends = self._period()
            return {
                "day": state["day"],
                "spent": state["spent"],
                "limit": self.daily,
                "in_flight": sum(state["reserved"].values()),
                "resets_at": ends.isoformat(timespec="minutes"),
            }
