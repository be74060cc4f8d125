"""Kernel track: KernelBench-style problems, reference Triton solutions, and the dual-reward validator."""

from pathlib import Path

from .validator import VALIDATOR_DEFAULTS, KernelResult, evaluate

PROBLEMS_DIR = Path(__file__).parent / "problems"
SOLUTIONS_DIR = Path(__file__).parent / "solutions"

__all__ = ["PROBLEMS_DIR", "SOLUTIONS_DIR", "VALIDATOR_DEFAULTS", "KernelResult", "evaluate"]
