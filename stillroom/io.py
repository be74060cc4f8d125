"""Atomic writes and validated JSONL reading.

Every artifact is written to a temporary name beside its destination and renamed into place, so a
crashed job never leaves a file that looks finished. Readers name the file, line and key on bad
data.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import functools
import json
import os
import re
import shutil
import tempfile
import time
import tokenize
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


class DataError(ValueError):
    """Bad input data; the message names the file, the row and the key."""


# How a full, read-only or over-quota filesystem fails a write(): the OSError names no file.
_WRITE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM}
)
# The random part tempfile puts between a temporary file's prefix and suffix.
_TMP_RANDOM = r"[a-z0-9_]{8}"


def _tmp_beside(path: Path, suffix: str = "", directory: bool = False) -> Path:
    """A new temporary file (or directory) beside ``path``; on a full disk the error names
    ``path``, not the temporary's random name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    where = {"prefix": f".{path.name}.", "suffix": suffix + ".tmp", "dir": path.parent}
    try:
        if directory:
            return Path(tempfile.mkdtemp(**where))
        fd, tmp = tempfile.mkstemp(**where)
    except OSError as exc:
        if exc.errno in _WRITE_ERRNOS:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    os.close(fd)
    return Path(tmp)


def stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """The temporary siblings ``atomic_path`` and ``atomic_dir`` make for ``path``
    (``.<name>.<8 random>.tmp``) that are there now: what a killed writer of ``path`` left behind.
    Nothing else matches, not even another output's (``.sft.adapter.<random>.tmp`` is not
    ``sft``'s)."""
    path = Path(str(path).rstrip("/"))
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{_TMP_RANDOM}\.tmp")
    if not path.parent.is_dir():
        return []
    return sorted(p for p in path.parent.iterdir() if pattern.fullmatch(p.name))


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Remove what ``stale_temporaries`` finds; return it. Only for a job that owns ``path`` (the
    workflow runs one job per output at a time): a concurrent writer's temporary would go too."""
    stale = stale_temporaries(path)
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return stale


def _destination(path: Path, tmp: Path, filename: Any) -> Path | None:
    """Where a failed operation on ``filename`` would have landed in ``path`` (the temporary stands
    for the artifact); None for a file outside the temporary."""
    if filename is None:
        return path
    try:
        rel = Path(os.fsdecode(filename)).relative_to(tmp)
    except (TypeError, ValueError):
        return None
    return path / rel if rel.parts else path


@contextlib.contextmanager
def _writing(
    path: Path, tmp: Path, errnos: frozenset[int] | None = _WRITE_ERRNOS
) -> Iterator[None]:
    """Raise a write error that names no file, or only the temporary, again naming the artifact:
    a write() on a full disk says only ``[Errno 28] No space left on device``. ``errnos``: the
    errors taken as the write's (None: any)."""
    try:
        yield
    except OSError as exc:
        where = _destination(path, tmp, exc.filename)
        if where is None or (errnos is not None and exc.errno not in errnos):
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(where)) from exc


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path; on success fsync it and rename it onto ``path``. An OSError
    of the write names ``path``."""
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        with _writing(path, tmp):
            yield tmp
        with _writing(path, tmp, errnos=None):
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            # mkstemp makes 0600; artifacts are shared like normal files
            os.chmod(tmp, 0o666 & ~_UMASK)
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; on success replace ``path`` with it in one rename. An OSError
    of the writes names the file under ``path`` (or ``path``)."""
    path = Path(path)
    tmp = _tmp_beside(path, directory=True)
    try:
        with _writing(path, tmp):
            yield tmp
        with _writing(path, tmp, errnos=None):
            os.chmod(tmp, 0o777 & ~_UMASK)
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def dumps_line(record: Mapping[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"


def write_jsonl(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> int:
    """Write all records atomically; return how many were written."""
    n = 0
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(dumps_line(rec))
            n += 1
    return n


def read_jsonl(
    path: str | os.PathLike,
    required: Sequence[str] = (),
    types: Mapping[str, type | tuple[type, ...]] | None = None,
) -> list[dict[str, Any]]:
    """Read a JSONL file, checking each row has ``required`` keys (and ``types`` where given).

    Raises DataError naming the file, the 1-based line number and the key.
    """
    return list(iter_jsonl(path, required, types))


def iter_lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each non-blank line. The file is read as bytes and decoded a
    line at a time, so undecodable bytes are a DataError naming the file and line (numbers count
    blank lines too, so they match an editor's)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if raw.strip():
                yield lineno, _decode(path, lineno, raw)


def _decode(path: Path, lineno: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _not_text(path, lineno, raw, exc) from None


def _not_text(
    path: Path, lineno: int, raw: bytes, exc: UnicodeDecodeError, encoding: str = "UTF-8"
) -> DataError:
    return DataError(
        f"{path}:{lineno}: not {encoding} text (byte 0x{raw[exc.start]:02x} at column "
        f"{exc.start + 1})"
    )


def csv_rows(path: str | os.PathLike) -> int:
    """How many data rows a CSV file holds (its header and blank lines not counted), each checked
    to be UTF-8 text: a byte that is not is a DataError naming the file, the row (0-based, as
    dataset sources number rows) and the line. A quoted field may span lines; quotes and newlines
    are single bytes in UTF-8, so records are told apart on the raw bytes."""
    path = Path(path)
    records, quoted, started = 0, False, False
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                where = "its header" if records == 0 else f"row {records - 1}"
                raise DataError(
                    f"{_not_text(path, lineno, raw, exc)} in {where}; save the file as UTF-8"
                ) from None
            quoted ^= raw.count(b'"') % 2 == 1
            started = started or bool(raw.strip())
            if started and not quoted:
                records, started = records + 1, False
    return max(records - 1, 0)


def read_python(path: str | os.PathLike) -> str:
    """A Python file's text as the interpreter reads it: in the encoding its BOM or coding line
    declares (PEP 263), else UTF-8, the BOM dropped and every newline made \\n. A file Python
    could not decode is a DataError naming the file, line and byte."""
    path = Path(path)
    lines = path.read_bytes().splitlines(keepends=True)
    try:
        encoding, _ = tokenize.detect_encoding(functools.partial(next, iter(lines), b""))
    except SyntaxError as exc:
        if not exc.msg.startswith("invalid or missing encoding declaration"):
            # a coding line naming no codec, or one at odds with the BOM
            raise DataError(f"{path}: {exc.msg} (its BOM or coding line)") from None
        # a first or second line that is not UTF-8, which the decoding below names by its byte
        encoding = "utf-8"
    decode = codecs.getincrementaldecoder(encoding)().decode  # drops a BOM at the start only
    text = []
    for lineno, raw in enumerate(lines, 1):
        try:
            text.append(decode(raw))
        except UnicodeDecodeError as exc:
            if encoding != "utf-8":
                raise _not_text(path, lineno, raw, exc, f"{encoding} (its coding line's)") from None
            raise DataError(
                f"{_not_text(path, lineno, raw, exc)}, which Python reads a file in unless a "
                "coding line (PEP 263) says otherwise"
            ) from None
    return "".join(text).replace("\r\n", "\n").replace("\r", "\n")


def parse_row(
    path: str | os.PathLike,
    lineno: int,
    line: str | bytes,
    required: Sequence[str] = (),
    types: Mapping[str, type | tuple[type, ...]] | None = None,
) -> dict[str, Any]:
    """One JSONL line as a dict with ``required`` keys (of ``types`` where given), or a DataError
    naming ``path``, ``lineno`` and what was expected."""
    if isinstance(line, bytes):
        line = _decode(Path(path), lineno, line)
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})"
        ) from None
    if not isinstance(rec, dict):
        raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
    if _SURROGATE_ESCAPE.search(line):
        _no_lone_surrogates(path, lineno, rec)
    for key in required:
        if key not in rec:
            raise DataError(
                f"{path}:{lineno}: missing key '{key}' (row has: {', '.join(sorted(rec))})"
            )
    for key, typ in (types or {}).items():
        if key in rec and not isinstance(rec[key], typ):
            want = typ.__name__ if isinstance(typ, type) else " or ".join(t.__name__ for t in typ)
            raise DataError(
                f"{path}:{lineno}: key '{key}' should be {want}, "
                f"got {type(rec[key]).__name__} {rec[key]!r:.60}"
            )
    return rec


# A \uD800-\uDFFF escape: the only way a line that decoded as UTF-8 can give a surrogate. JSON
# accepts a lone one, but no UTF-8 writer does, so such a row would fail later, far from its file
# and line. Most lines hold no such escape, and their strings are never walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _shown(text: str) -> str:
    """``text`` with surrogates as \\uXXXX escapes: a message naming one must still print."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _no_lone_surrogates(path: str | os.PathLike, lineno: int, value: Any, key: str = "") -> None:
    """A DataError naming the key (dotted, with list indices) of the first string, or key name,
    holding a surrogate that is not half of a pair (json.loads joins a valid pair into one
    character)."""
    if isinstance(value, dict):
        for k, v in value.items():
            name = f"{key}.{_shown(k)}" if key else _shown(k)
            _check_text(path, lineno, k, f"key name '{name}'")
            _no_lone_surrogates(path, lineno, v, name)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_lone_surrogates(path, lineno, v, f"{key}[{i}]")
    elif isinstance(value, str):
        _check_text(path, lineno, value, f"key '{key}'")


def _check_text(path: str | os.PathLike, lineno: int, text: str, what: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(
            f"{path}:{lineno}: {what} holds a lone surrogate (\\u{ord(text[exc.start]):04x} at "
            f"character {exc.start + 1}), which is not text; expected a character or a whole "
            "surrogate pair"
        ) from None


def iter_jsonl(
    path: str | os.PathLike,
    required: Sequence[str] = (),
    types: Mapping[str, type | tuple[type, ...]] | None = None,
) -> Iterator[dict[str, Any]]:
    for lineno, line in iter_lines(path):
        yield parse_row(path, lineno, line, required, types)


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): obj}


def fingerprint_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> str:
    """The settings that differ between two fingerprints, as ``key: old -> new`` (dotted keys)."""
    a, b = _flat(dict(old or {})), _flat(dict(new or {}))
    missing = object()
    parts = [
        f"{k}: {json.dumps(a.get(k)) if k in a else '(unset)'} -> "
        f"{json.dumps(b.get(k)) if k in b else '(unset)'}"
        for k in sorted(set(a) | set(b))
        if a.get(k, missing) != b.get(k, missing)
    ]
    return "; ".join(parts)


class Journal:
    """Records of a long job appended to ``<out>.partial`` and fsynced as they finish, so a job
    killed at any point resumes without losing or redoing a finished record; ``out`` itself appears
    (atomically) only when ``finish`` is called.

    A kill can leave the last line torn (dropped, with a warning) or complete but without its
    newline (the newline is added, so the next append starts a line of its own). Every record has
    a ``key``; anything else wrong is a DataError naming the file and line.

    With a ``fingerprint`` (everything the records depend on: params, input hashes) the file opens
    with it; a partial file without it or with another one (written under other settings, or by an
    older version) is moved aside to ``<out>.partial.stale-<time>`` with a warning naming the
    settings that differ, and the job starts over: records of other settings are never mixed in.
    """

    def __init__(
        self,
        out: str | os.PathLike,
        log=print,
        fingerprint: Mapping[str, Any] | None = None,
    ):
        self.out = Path(out)
        self.partial = Path(f"{out}.partial")
        self.log = log
        self.fingerprint = json.loads(json.dumps(fingerprint)) if fingerprint else None
        self._fh = None

    def load(self) -> dict[str, dict[str, Any]]:
        """The finished records of an earlier run, by key."""
        if not self.partial.exists():
            return {}
        data = self.partial.read_bytes()
        # a complete file ends in a newline, leaving an empty tail
        *lines, tail = data.split(b"\n")
        torn = None
        if tail.strip():
            try:
                parse_row(self.partial, len(lines) + 1, tail)
                lines.append(tail)
            except DataError as exc:
                # killed mid-write: that record never finished, so it is redone
                torn = exc
        rows = [(i, raw) for i, raw in enumerate(lines, 1) if raw.strip()]
        first = self._row(*rows[0]) if rows else {}
        if rows and (self.fingerprint is not None or "fingerprint" in first):
            if first.get("fingerprint") != self.fingerprint:
                self._set_aside(first.get("fingerprint"))
                return {}
            rows = rows[1:]
        done = {}
        for i, raw in rows:
            rec = self._row(i, raw, required=("key",))
            done[rec["key"]] = rec
        if torn is not None:
            self.log(f"warning: dropped a torn last record: {torn}")
            with open(self.partial, "r+b") as fh:
                fh.truncate(len(data) - len(tail))
        elif tail.strip():
            self.log(
                f"warning: {self.partial}:{len(lines)}: the last record lacked its newline; "
                "added it"
            )
            with open(self.partial, "ab") as fh:
                fh.write(b"\n")
        return done

    def _row(self, lineno: int, raw: bytes, required: Sequence[str] = ()) -> dict[str, Any]:
        try:
            return parse_row(self.partial, lineno, raw, required)
        except DataError as exc:
            raise DataError(
                f"{exc}; a corrupt record, not one a kill leaves (move the resume file aside "
                "to start over)"
            ) from None

    def _set_aside(self, written: Mapping[str, Any] | None) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        stale = self.partial.with_name(f"{self.partial.name}.stale-{stamp}")
        n = 1
        while stale.exists():
            n += 1
            stale = self.partial.with_name(f"{self.partial.name}.stale-{stamp}-{n}")
        os.replace(self.partial, stale)
        why = (
            "has no fingerprint (an older format)"
            if written is None
            else f"was written with other settings ({fingerprint_diff(written, self.fingerprint)})"
        )
        self.log(f"warning: {self.partial} {why}; moved it to {stale.name} and starting over")

    def __enter__(self) -> Journal:
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.partial.exists() or self.partial.stat().st_size == 0
        self._fh = open(self.partial, "a", encoding="utf-8")
        if fresh and self.fingerprint is not None:
            self.append([{"fingerprint": self.fingerprint}])
        return self

    def __exit__(self, *exc) -> None:
        self._fh.close()

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        self._fh.write("".join(dumps_line(r) for r in records))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def finish(self, records: Iterable[Mapping[str, Any]], keep: bool = False) -> int:
        """Write ``out`` (atomically) and remove the partial file, or ``keep`` it: a job run again
        under the same fingerprint then writes ``out`` from it without redoing a record."""
        n = write_jsonl(self.out, records)
        if not keep:
            self.partial.unlink(missing_ok=True)
        return n


def stat_fingerprint(path: str | os.PathLike) -> dict[str, list[int]]:
    """Size and modification time of each file under ``path`` (or of the file): cheap to take for a
    large checkpoint, and a rebuilt one differs."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {
        str(f.relative_to(path) if path.is_dir() else f.name): [
            f.stat().st_size,
            f.stat().st_mtime_ns,
        ]
        for f in files
        if f.exists()
    }
