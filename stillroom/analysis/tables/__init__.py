"""The result tables, one module per kind (paired, budget, effort, teachers, kernels): each computes
its rows as a DataFrame typed by its schema (schema.py) and lays them out for the one renderer
(render.py: Markdown, LaTeX, CSV); plots.py draws the paired and budget plots.

``load`` reads a written table back as its typed DataFrame."""

from .schema import load

__all__ = ["load"]
