"""Stillroom: reproducible distillation pipelines, from prompt pools to paper tables."""

__version__ = "0.1.0"
