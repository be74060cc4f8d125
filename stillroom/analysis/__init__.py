"""Paired comparisons of models scored on the same problems: grids of graded samples and the
statistics the tables report."""
