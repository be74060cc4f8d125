"""A stage's job imports peft, torchao and bitsandbytes (stillroom/runtime/nf4.py), whose harmless
load messages stillroom drops at their loggers (stillroom/__init__.py HARMLESS): none reaches the
job's log, while the same imports with those filters removed print them here ("alone" means with
stillroom imported and its filters cleared)."""

import os
import subprocess
import sys

import pytest

from stillroom import HARMLESS

from .conftest import REPO

pytestmark = pytest.mark.slow  # each import of peft takes seconds


def stderr_of(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def harmless_lines(text: str) -> list[str]:
    return [
        line
        for line in text.splitlines()
        if any(all(part in line for part in parts) for parts in HARMLESS.values())
    ]


def test_a_stages_imports_log_none_of_the_harmless_load_messages():
    alone = harmless_lines(
        stderr_of(
            "import logging, stillroom\n"
            "for name in stillroom.HARMLESS:\n"
            "    logging.getLogger(name).filters.clear()\n"
            "import stillroom.runtime.nf4"
        )
    )
    if not alone:
        pytest.skip("peft, torchao and bitsandbytes print no load messages on this machine")
    job = stderr_of(
        "import logging, stillroom.runtime.nf4\n"
        "logging.getLogger('torchao').warning('another torchao warning')"
    )
    assert harmless_lines(job) == [], job[-3000:]
    assert "another torchao warning" in job  # the loggers still say everything else
