"""The corpus of honest real-world Triton kernels (issue 41): each entry is a candidate ``ModelNew``
for a KernelBench-style problem, and must earn 1 from ``stillroom.kernels.evaluate`` on CPU, or be
refused with a reason a GPU compile would give too (``Entry.refusal``).

Three kinds of origin, none of it third-party code copied here:

- ``library``: the candidate imports a Triton library installed as a test dependency (Liger-Kernel,
  flash-linear-attention's fla-core, ...) and launches its ``@triton.jit`` kernel or its launcher:
  the kernel text the validator judges is the package's, read at test time;
- ``*-style``: kernels we wrote in the style of public code (Inductor's generated Triton, the Triton
  tutorials, unsloth, attorch), each citing the file it imitates.

Entries are data (``Entry``); tests/kernels/test_corpus.py evaluates them and bench/kernel_corpus.py
prints the table. ``RULES`` lists the entries the rule reward refuses (the paper's block limit, an
output a host op makes), which no GPU compile would."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PROBLEM_DIRS = (Path(__file__).resolve().parent / "problems", REPO / "stillroom/kernels/problems")


@dataclass(frozen=True)
class Entry:
    name: str  # unique, also the test id
    origin: str  # what it is or imitates: package and path, or a URL
    kind: str  # "library" or "<style>-style"
    problem: str  # a file name (no .py) of PROBLEM_DIRS
    candidate: str  # the ModelNew source
    requires: str | None = None  # the module a library entry imports
    refusal: str | None = None  # a GPU-faithful refusal: a phrase of the reason expected


def problem_source(name: str) -> str:
    """The reference problem ``name``: the corpus's own problems first, then stillroom's."""
    for folder in PROBLEM_DIRS:
        path = folder / f"{name}.py"
        if path.exists():
            return path.read_text()
    raise FileNotFoundError(f"no kernel problem {name!r} in {', '.join(map(str, PROBLEM_DIRS))}")


def import_error(module: str | None) -> str | None:
    """Why ``module`` cannot be imported on this host (a library that needs a GPU), or None."""
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party import is the answer
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    return None


def _entries() -> list[Entry]:
    from . import attorch_style, fla, inductor_style, liger, tutorial_style, unsloth_style

    entries = [
        *liger.ENTRIES,
        *fla.ENTRIES,
        *inductor_style.ENTRIES,
        *tutorial_style.ENTRIES,
        *unsloth_style.ENTRIES,
        *attorch_style.ENTRIES,
    ]
    names = [e.name for e in entries]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"corpus entries named twice: {duplicated}")
    return entries


ENTRIES: list[Entry] = _entries()
BY_NAME = {e.name: e for e in ENTRIES}

# The fast slice (make test-fast): evaluated with the defaults GRPO uses (ValidatorOptions:
# trials and every generated case); each earns 1 today. The others are marked slow and run cheap.
FAST = (
    "tutorial_01_vector_add",
    "tutorial_05_layer_norm",
    "tutorial_splitk_matmul_zeros",
    "tutorial_03_matmul_tl_minimum",
    "unsloth_swiglu_fg",
    "attorch_softmax",
)
CHEAP = {"trials": 1, "cases": ["odd_shape"]}


def options(name: str) -> dict:
    """evaluate()'s options for entry ``name``."""
    return {} if name in FAST else dict(CHEAP)


# Entries refused by the rule reward, not by a GPU compile: AutoTriton's validate_syntax (the
# seed) holds every block to at most 2048 (``max_block_size``), and on a GPU the autotuner may
# pick any config, so every config is held to it; and the reward scores the program Triton runs,
# so an output a torch op makes on the host earns 0. Each with a phrase of its reason; the block
# ones earn 1 under the limit their configs use (``RULE_LIMITS``, tested).
BLOCK_LIMIT = "exceeds 2048"
RULES: dict[str, str] = {
    "fla_sigmoid": BLOCK_LIMIT,  # autotunes BLOCK_SIZE up to 4096
    "fla_swish": BLOCK_LIMIT,
    "fla_logsigmoid": BLOCK_LIMIT,
    "liger_dyt": BLOCK_LIMIT,
    # Liger's launcher sums the kernel's per-row losses with torch.sum on the host
    "liger_cross_entropy": "output 0 is not made by the program",
}
RULE_LIMITS = {"max_block_size": 8192}


def expected_reason(name: str) -> str | None:
    """The phrase entry ``name``'s reasons must hold when it earns 0; None when it must earn 1."""
    return RULES.get(name) or BY_NAME[name].refusal


# Libraries we tried that cannot be a source on a machine without a GPU: not test dependencies
# (flag-gems pins numpy 1.26), so what their import raised here is recorded, with the version.
NEEDS_A_GPU = {
    "flag-gems 5.0.2 (flag_gems)": "RuntimeError: No device were detected on your machine ! "
    "Please check that your driver is complete.",
    "gemlite 0.6.0.post2 (gemlite)": "AssertionError: Torch not compiled with CUDA enabled",
    "unsloth 2026.10.9 (unsloth)": "ImportError: Unsloth: Please install unsloth_zoo via `pip "
    "install unsloth_zoo` then retry! (its device_type.py raises 'Unsloth cannot find any torch "
    "accelerator? You need a GPU.' without one); its kernels are imitated instead",
}
