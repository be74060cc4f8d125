"""Paired comparisons of models scored on the same problems: grids of graded samples, the
statistics the tables report, and the tables themselves (tables/: one module per kind, their
schemas and the one renderer)."""
