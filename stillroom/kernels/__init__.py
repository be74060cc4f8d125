"""Kernel track: KernelBench-style problems with reference Triton solutions, the dual-reward
validator (execution x rules) and its sandboxed worker, the reward every stage takes from it, and
the kernel tables."""

from .problemset import PROBLEMS_DIR, SOLUTIONS_DIR
from .validator import KernelResult, evaluate

__all__ = ["PROBLEMS_DIR", "SOLUTIONS_DIR", "KernelResult", "evaluate"]
