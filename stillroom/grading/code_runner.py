"""The two processes of a code grading run (code.py starts them, each in its own sandbox).

The candidate runs the program, then answers calls of its top-level functions; the judge runs the
problem's tests with those names bound to proxies, and its exit status is the verdict (0 passed,
2 an assert failed, 3 anything else). They talk over two pipes, one JSON document a line, in a
data encoding with tags for what JSON lacks (tuples, sets, dicts with any keys, bytes, complex
numbers, infinite floats, ranges; iterators arrive as iterators over their items, materialised on
the candidate's side); never pickle, so nothing but plain data crosses. The candidate can then
choose its own return values and nothing else: the tests, the comparisons, the exception types
and the verdict live in a process it cannot reach. Calls see copies: a list, dict, set or
bytearray passed positionally and changed in place by the function is changed the same way in the
tests after the call (other changes are not seen), and callables cannot be passed.

Standard library only: both run this file in ``python -I -S -B``, where nothing else can be
imported.

    python -I -S -B code_runner.py candidate|judge SANDBOX_PY IN_FD OUT_FD  < SPEC_JSON

The spec (JSON on stdin): limits (``cpu_s``, ``memory_bytes``, ``file_bytes``) and the
candidate's ``program`` or the judge's ``tests`` and ``entry_point``.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import json
import math
import os
import sys
import traceback
import types

MAX_LINE = 16 << 20  # bytes of one message: a longer reply is a broken candidate
MAX_TEXT = 2000  # characters of an exception's message or traceback carried over

EXIT_PASSED, EXIT_FAILED, EXIT_ERROR = 0, 2, 3
MUTABLE = (list, dict, set, bytearray)  # arguments sent back after a call: changed in place


# The encoding: JSON null, booleans, numbers, strings and arrays (lists) stand for themselves;
# every JSON object is one tag.


def encode(value):
    """Plain data as JSON-ready values; TypeError for anything else."""
    # subclasses (a namedtuple, an IntEnum, a Counter) cross as their built-in base
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        value = float(value)
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, complex):
        return {"complex": [encode(value.real), encode(value.imag)]}
    if isinstance(value, (bytes, bytearray)):
        return {"bytearray" if isinstance(value, bytearray) else "bytes": bytes(value).hex()}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, frozenset):
        return {"frozenset": [encode(v) for v in value]}
    if isinstance(value, set):
        return {"set": [encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, range):
        return {"range": [value.start, value.stop, value.step]}
    if hasattr(type(value), "__next__"):  # a generator, map, zip, ...: its items
        return {"iter": [encode(v) for v in value]}
    raise TypeError(f"{type(value).__name__} is not plain data (the values that can cross)")


def _floats(text: str) -> float:
    if text not in ("inf", "-inf", "nan"):
        raise ValueError(f"bad float tag {text!r}")
    return float(text)


_TAGS = {
    "tuple": lambda v: tuple(decode(x) for x in _list(v)),
    "set": lambda v: {decode(x) for x in _list(v)},
    "frozenset": lambda v: frozenset(decode(x) for x in _list(v)),
    "dict": lambda v: {decode(k): decode(x) for k, x in (_pair(p) for p in _list(v))},
    "bytes": lambda v: bytes.fromhex(_str(v)),
    "bytearray": lambda v: bytearray.fromhex(_str(v)),
    "float": lambda v: _floats(_str(v)),
    "complex": lambda v: complex(*(_number(decode(x)) for x in _pair(v))),
    "range": lambda v: range(*(_int(x) for x in _list(v))),
    "iter": lambda v: iter([decode(x) for x in _list(v)]),
}


def _list(v) -> list:
    if type(v) is not list:
        raise ValueError(f"expected a JSON array, got {type(v).__name__}")
    return v


def _pair(v) -> list:
    if len(_list(v)) != 2:
        raise ValueError("expected a pair")
    return v


def _str(v) -> str:
    if type(v) is not str:
        raise ValueError(f"expected a string, got {type(v).__name__}")
    return v


def _int(v) -> int:
    if type(v) is not int:
        raise ValueError(f"expected an integer, got {type(v).__name__}")
    return v


def _number(v):
    if type(v) not in (int, float):
        raise ValueError(f"expected a number, got {type(v).__name__}")
    return v


def decode(obj):
    """The value an ``encode``d JSON value stands for: only built-in data types; ValueError on
    anything else (TypeError: an unhashable key or set item)."""
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is list:
        return [decode(v) for v in obj]
    if type(obj) is dict and len(obj) == 1:
        ((tag, value),) = obj.items()
        if tag in _TAGS:
            return _TAGS[tag](value)
    raise ValueError(f"not a value of the encoding: {str(obj)[:80]}")


def _no_constant(name: str):
    raise ValueError(f"bare {name} (floats that are not finite are tagged)")


class Channel:
    """One JSON document a line: read from ``in_fd``, written to ``out_fd``."""

    def __init__(self, in_fd: int, out_fd: int):
        self.reader = os.fdopen(in_fd, "rb")
        self.out_fd = out_fd

    def send(self, message: dict) -> None:
        data = (json.dumps(message, allow_nan=False, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[os.write(self.out_fd, view) :]

    def receive(self) -> dict | None:
        """The next message, or None at the end of the stream; ValueError on a broken one."""
        line = self.reader.readline(MAX_LINE + 1)
        if not line:
            return None
        if not line.endswith(b"\n"):
            raise ValueError(f"a message longer than {MAX_LINE} bytes, or cut off")
        message = json.loads(line, parse_constant=_no_constant)
        if type(message) is not dict:
            raise ValueError("a message is not a JSON object")
        return message


def _load_sandbox(path: str):
    spec = importlib.util.spec_from_file_location("stillroom_sandbox", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fail(code: int):
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(code)


def _start(sandbox_py: str, in_fd: int, out_fd: int):
    """Either side's start: its spec (stdin), its channel, and its resource limits in force."""
    spec = json.loads(sys.stdin.buffer.read())
    sandbox = _load_sandbox(sandbox_py)
    sandbox.limit(
        cpu_s=spec["cpu_s"],
        memory_bytes=spec["memory_bytes"],
        file_bytes=spec["file_bytes"],
        processes=0,
    )
    return spec, Channel(in_fd, out_fd), sandbox


# The candidate's side: everything here can be replaced by the program; it only ever answers.


def candidate(sandbox_py: str, in_fd: int, out_fd: int) -> None:
    sys.dont_write_bytecode = True
    spec, channel, sandbox = _start(sandbox_py, in_fd, out_fd)
    sandbox.guard(box=os.getcwd())
    module = types.ModuleType("solution")  # not __main__: demo blocks reading stdin stay off
    sys.modules["solution"] = module
    try:
        exec(compile(spec["program"], "solution.py", "exec"), module.__dict__)
    except BaseException:
        _fail(EXIT_ERROR)  # a program that does not run at all is an error, not a failed test
    names = module.__dict__
    callables = [
        k
        for k, v in names.items()
        if not k.startswith("__") and callable(v) and not isinstance(v, types.ModuleType)
    ]
    modules = [[k, v.__name__] for k, v in names.items() if isinstance(v, types.ModuleType)]
    channel.send({"callables": callables, "modules": modules})
    while True:
        message = channel.receive()
        if message is None:  # the judge is done
            sys.stdout.flush()
            os._exit(0)
        try:
            function = names[message["call"]]
            args = decode(message["args"])
            kwargs = {k: decode(v) for k, v in message["kwargs"]}
            value = function(*args, **kwargs)
            changed = [encode(a) if isinstance(a, MUTABLE) else None for a in args]
            reply = {"return": encode(value), "changed": changed}
        except BaseException as e:  # noqa: BLE001 - every failure of the program is an answer
            reply = {
                "raise": {
                    "type": type(e).__name__,
                    "mro": [c.__name__ for c in type(e).__mro__ if c.__module__ == "builtins"],
                    "message": str(e)[:MAX_TEXT],
                    "traceback": traceback.format_exc()[-MAX_TEXT:],
                }
            }
        channel.send(reply)


# The judge's side: trusted code (the benchmark's tests) and data from the candidate.


class CandidateGone(BaseException):
    """The candidate's process ended or broke the protocol: no test may catch this."""


class CandidateError(Exception):
    """An exception the candidate's function raised, of no built-in type."""


def _text(value) -> str:
    if type(value) is not str:
        raise CandidateGone(f"protocol: expected a string, got {type(value).__name__}")
    return value[:MAX_TEXT]


def _rebuild(info) -> Exception:
    """The candidate's exception as one of the same built-in type (tests may expect, say, a
    ValueError), with its traceback as a note; never a BaseException that is not an
    Exception."""
    if type(info) is not dict or type(info.get("mro")) is not list:
        raise CandidateGone("protocol: a malformed exception")
    name, message = _text(info.get("type")), _text(info.get("message"))
    exc: Exception | None = None
    for base in info["mro"]:
        cls = getattr(builtins, _text(base), None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                exc = cls(message)
                break
            except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError takes five arguments
                continue
    if exc is None:
        exc = CandidateError(f"{name}: {message}")
    exc.add_note("raised by the candidate's code:\n" + _text(info.get("traceback")))
    return exc


def _refill(arg, new) -> None:
    """``arg`` (the tests' own object) given the contents the candidate's function left in it."""
    base = next((t for t in MUTABLE if isinstance(arg, t)), None)
    if base is None or type(new) is not base:
        raise ValueError(f"an argument came back as {type(new).__name__}")
    if new == arg:
        return
    if base is dict or base is set:
        arg.clear()
        arg.update(new)
    else:
        arg[:] = new


def _proxy(channel: Channel, name: str):
    def call(*args, **kwargs):
        request = {
            "call": name,
            "args": [encode(a) for a in args],
            "kwargs": [[k, encode(v)] for k, v in kwargs.items()],
        }
        try:
            channel.send(request)
            reply = channel.receive()
        except OSError as e:
            raise CandidateGone(f"the candidate's process is gone ({e})") from None
        except (ValueError, RecursionError) as e:
            raise CandidateGone(f"protocol: {type(e).__name__}: {e}") from None
        if reply is None:
            raise CandidateGone(f"the candidate's process ended during a call of {name}")
        if set(reply) == {"return", "changed"}:
            try:
                value = decode(reply["return"])
                for arg, new in zip(args, _list(reply["changed"]), strict=True):
                    if new is not None:
                        _refill(arg, decode(new))
            except (ValueError, TypeError, RecursionError) as e:
                raise CandidateGone(f"protocol: {type(e).__name__}: {e}") from None
            return value
        if set(reply) == {"raise"}:
            raise _rebuild(reply["raise"])
        raise CandidateGone("protocol: a reply is neither a return nor a raise")

    call.__name__ = call.__qualname__ = name
    return call


def judge(sandbox_py: str, in_fd: int, out_fd: int) -> None:
    spec, channel, sandbox = _start(sandbox_py, in_fd, out_fd)
    entry = spec["entry_point"]
    try:
        hello = channel.receive()
        if hello is None:
            raise CandidateGone("the program did not run to the end (its error is above)")
        callables, modules = hello.get("callables"), hello.get("modules")
        if type(callables) is not list or type(modules) is not list:
            raise CandidateGone("protocol: a malformed greeting")
        sandbox.guard(box=None)  # before any import a candidate names
        tests: dict = {"__name__": "tests"}
        # modules the program imported, as the tests ran in its namespace before: this
        # process's own copies, and only the standard library's
        for pair in modules:
            alias, name = (_text(x) for x in _pair(pair))
            if name.partition(".")[0] in sys.stdlib_module_names and alias.isidentifier():
                try:
                    tests[alias] = importlib.import_module(name)
                except Exception:  # noqa: BLE001 - not importable here: the tests do without
                    pass
        for name in map(_text, callables):
            if name.isidentifier() and name != "check":  # the tests' check(), not the program's
                tests[name] = _proxy(channel, name)
        if entry is not None and entry not in tests:
            raise NameError(f"entry point {entry!r} is not defined by the program")
        exec(compile(spec["tests"], "tests.py", "exec"), tests)
        if entry is not None and callable(tests.get("check")):
            tests["check"](tests[entry])
    except AssertionError:
        _fail(EXIT_FAILED)
    except BaseException:  # noqa: BLE001 - anything else the tests hit is an error
        _fail(EXIT_ERROR)
    sys.stderr.flush()
    os._exit(EXIT_PASSED)


if __name__ == "__main__":
    role, sandbox_path, fd_in, fd_out = sys.argv[1:]
    {"candidate": candidate, "judge": judge}[role](sandbox_path, int(fd_in), int(fd_out))
