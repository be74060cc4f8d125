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
prints the table. ``EXPECTED_FIXED_ELSEWHERE`` lists the entries that fail today for a cause another
branch of issue 41 fixes, with the reason they fail with now."""

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


# Entries that earn 0 today for a cause another branch of issue 41 fixes (the Inductor runtime
# helpers' import and whitelist, libdevice, in-body constexpr annotations, builtin min/max,
# parameters named like launch options, docstrings, autotune pre_hook/reset_to_zero, custom scan
# combines), with a phrase of the reason seen now. Once that branch is merged, delete them here:
# each should then earn 1, or earn 0 with its OPEN reason or its GPU-faithful refusal.
# Every library and Inductor-style candidate imports torch._dynamo (Liger, fla) or
# torch._inductor.runtime.triton_helpers, whose import makes Inductor's cache directory.
IMPORT_CACHE = "failed at import: PermissionError: sandbox: os.mkdir"
EXPECTED_FIXED_ELSEWHERE: dict[str, str] = {}

# Entries that earn 0, once the branch above is merged, for a cause no branch of issue 41 fixes
# and a GPU compile would not give, with the reason seen (the import made to work by hand): for
# the integrator to decide.
BLOCK_LIMIT = "exceeds 2048"  # every autotune config is held to max_block_size, even unchosen ones
OPEN: dict[str, str] = {
    "fla_sigmoid": BLOCK_LIMIT,
    "fla_swish": BLOCK_LIMIT,
    "fla_logsigmoid": BLOCK_LIMIT,
    "liger_dyt": BLOCK_LIMIT,
    # Liger's launcher sums the kernel's per-row losses with torch.sum on the host
    "liger_cross_entropy": "output 0 is not made by the program",
}


def expected_reason(name: str) -> str | None:
    """The phrase entry ``name``'s reasons must hold when it earns 0; None when it must earn 1."""
    return EXPECTED_FIXED_ELSEWHERE.get(name) or OPEN.get(name) or BY_NAME[name].refusal


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
