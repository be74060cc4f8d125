"""Kernel track: KernelBench-style problems with reference Triton solutions, the dual-reward
validator (execution x rules: a candidate's program extracted in a sandbox, checked, and replayed
by a trusted runner on inputs it never saw), the reward every stage takes from it, and the kernel
tables."""

from .problemset import PROBLEMS_DIR, SOLUTIONS_DIR
from .validator import KernelResult, evaluate

__all__ = ["PROBLEMS_DIR", "SOLUTIONS_DIR", "KernelResult", "evaluate"]
