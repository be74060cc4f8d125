"""How a problem is asked and where its answer is read, for every kind of problem.

Asked: a record's prompt as is, or for a kernel problem (whose record keeps the KernelBench file as
its prompt and its gold) that file inside ``KERNEL_INSTRUCTION``; an effort tag in the student's own
syntax goes into a system turn. Read: only the text after the last ``</think>``, and nothing at all
when a ``<think>`` after it is never closed; code answers are a fenced block of that text.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from string import Template
from typing import Any

KERNEL_INSTRUCTION = """\
Write a Triton implementation of the PyTorch module below. Name it `ModelNew`: it takes the same \
constructor arguments as `Model`, has the same parameters and buffers (same state_dict keys), and \
its `forward` returns the same outputs for the same inputs.

Do the computation in `@triton.jit` kernels launched from `forward`. Outside the kernels, \
`forward` may only allocate outputs and inspect or view shapes (`torch.empty`, `.shape`, \
`.contiguous()`, `.view()`); no torch math, no try/except, no global state. Import only torch, \
triton and math.

Think it through first, then give the complete module, imports included, in one ```python block.

```python
{source}
```"""

END_THINK = "</think>"


def kernel_instruction(problem_src: str) -> str:
    return KERNEL_INSTRUCTION.format(source=problem_src.strip("\n"))


def user_content(record: Mapping[str, Any]) -> str:
    """What a model is asked about a pool or benchmark record: its prompt, or for a kernel problem
    the instruction around the problem's source."""
    if record.get("kind") == "kernel":
        return kernel_instruction(record["prompt"])
    return record["prompt"]


def effort_tag(template: str, effort: str) -> str:
    """The student's effort syntax (e.g. "{reasoning effort: $effort}") for one effort."""
    return Template(template).substitute(effort=effort)


def with_effort_tag(messages: list[dict], tag: str | None, where: str = "system") -> list[dict]:
    """``messages`` with the effort ``tag`` in a system turn before them, or (``where`` "user",
    for a template that takes no system turn) on its own line at the head of the first user turn;
    no tag, no change."""
    if tag is None:
        return list(messages)
    if where == "system":
        return [{"role": "system", "content": tag}, *messages]
    first = next(i for i, m in enumerate(messages) if m["role"] == "user")
    user = {**messages[first], "content": f"{tag}\n{messages[first]['content']}"}
    return [*messages[:first], user, *messages[first + 1 :]]


def answer_text(response: str) -> str | None:
    """The part of ``response`` to grade, or None when a ``<think>`` block is never closed."""
    end = response.rfind(END_THINK)
    if response.find("<think>", end + 1 if end >= 0 else 0) >= 0:
        return None
    return response[end + len(END_THINK) :] if end >= 0 else response


_KERNEL_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)


def extract_code(response: str) -> str | None:
    """A kernel answer's module: the last fenced block after the reasoning that defines
    ``ModelNew`` (else the last block); None if there is none or the reasoning never ends."""
    text = answer_text(response)
    blocks = _KERNEL_BLOCK.findall(text) if text is not None else []
    if not blocks:
        return None
    with_model = [b for b in blocks if "class ModelNew" in b]
    return (with_model or blocks)[-1]


_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+-]*)[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


def extract_program(response: str) -> str | None:
    """A coding answer's program: the last ```python (or ```py) block after the reasoning, else the
    last bare block, else that whole text."""
    text = answer_text(response)
    if text is None:
        return None
    blocks = [(lang.lower(), textwrap.dedent(body)) for lang, body in _FENCE.findall(text)]
    for langs in (("python", "py", "python3"), ("",)):
        picked = [body for lang, body in blocks if lang in langs and body.strip()]
        if picked:
            return picked[-1]
    return text.strip() or None
