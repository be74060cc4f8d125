"""``stillroom.stats.paired_bootstrap`` and its companions at the path they were first
published under (they live in stillroom/analysis/stats.py)."""

from .analysis.stats import (
    Comparison,
    McNemar,
    holm,
    holm_adjusted,
    holm_comparisons,
    mcnemar_exact,
    paired_bootstrap,
)

__all__ = [
    "Comparison",
    "McNemar",
    "holm",
    "holm_adjusted",
    "holm_comparisons",
    "mcnemar_exact",
    "paired_bootstrap",
]
