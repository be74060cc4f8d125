"""One grader per kind: dispatch by kind, and a summary of the rules fit for provenance."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from stillroom.grading import GRADER_INFO, grade, grade_many


def test_grade_dispatch_and_unknown_kind():
    assert grade(r"\boxed{7}", "7", "math").correct
    assert grade("Answer: (J)", "J", "choice", letters="ABCDEFGHIJ").correct
    with pytest.raises(ValueError, match="essay"):
        grade("x", "y", "essay")
    with pytest.raises(ValueError, match="essay"):
        grade_many([(r"\boxed{7}", "7", "math"), ("x", "y", "essay")])


def test_grader_info_is_recordable():
    assert GRADER_INFO["math_verify"] == importlib.metadata.version("math-verify")
    assert json.loads(json.dumps(GRADER_INFO)) == GRADER_INFO
