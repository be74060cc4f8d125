"""Answer grading, one grader per kind of problem (math, choice, instructions, code, kernel), and
the formats every stage shares for asking a problem and reading its answer (formats.py).

Every grader returns a :class:`Grade`. A response with think tags is graded only on the text after
its last ``</think>``; a ``<think>`` left open after that point means the model never answered.

The names below load on first use: importing ``stillroom.grading.formats`` alone (as prompt
rendering does) must not import math-verify and sympy.
"""

import importlib
from typing import Any

_HOMES = {
    "GRADER_INFO": "dispatch",
    "KINDS": "dispatch",
    "grade": "dispatch",
    "grader": "dispatch",
    "grader_info": "dispatch",
    "item_limit": "dispatch",
    "grade_choice": "choice",
    "grade_math": "math",
    "TIMEOUT_S": "result",
    "Grade": "result",
    "Options": "result",
    "grade_many": "workers",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
