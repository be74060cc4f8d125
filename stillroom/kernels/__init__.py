"""Kernel track: KernelBench-style problems, reference Triton solutions, and (later) the validator."""
