"""The kernel track's question and answer format.

A kernel problem's record keeps the KernelBench file itself as its prompt (and as its gold: the
validator needs the reference source); what a model is asked is that file inside ``INSTRUCTION``.
The answer is reasoning, then the whole ``ModelNew`` module in a fenced Python block.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

INSTRUCTION = """\
Write a Triton implementation of the PyTorch module below. Name it `ModelNew`: it takes the same \
constructor arguments as `Model`, has the same parameters and buffers (same state_dict keys), and \
its `forward` returns the same outputs for the same inputs.

Do the computation in `@triton.jit` kernels launched from `forward`. Outside the kernels, `forward` \
may only allocate outputs and inspect or view shapes (`torch.empty`, `.shape`, `.contiguous()`, \
`.view()`); no torch math, no try/except, no global state. Import only torch, triton and math.

Think it through first, then give the complete module, imports included, in one ```python block.

```python
{source}
```"""

_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.S | re.I)


def instruction(problem_src: str) -> str:
    return INSTRUCTION.format(source=problem_src.strip("\n"))


def user_content(record: Mapping[str, Any]) -> str:
    """What a model is asked about a pool or benchmark record: its prompt, or for a kernel problem the
    instruction around the problem's source."""
    return instruction(record["prompt"]) if record.get("kind") == "kernel" else record["prompt"]


def extract_code(response: str) -> str | None:
    """The candidate module of a response: the last fenced block after the reasoning that defines
    ``ModelNew`` (else the last block); None if there is none or the reasoning never ends."""
    end = response.rfind("</think>")
    if response.find("<think>", end + 1 if end >= 0 else 0) >= 0:
        return None
    blocks = _BLOCK.findall(response[end + len("</think>") :] if end >= 0 else response)
    if not blocks:
        return None
    with_model = [b for b in blocks if "class ModelNew" in b]
    return (with_model or blocks)[-1]
