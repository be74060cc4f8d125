"""Kernel track: KernelBench-style problems, reference Triton solutions, and the dual-reward validator."""

from .validator import KernelResult, evaluate

__all__ = ["KernelResult", "evaluate"]
