"""Regenerate config/benchmarks/tinybench.jsonl, the small shipped benchmark of the embedded
default.

Its items come from the same generator as the pool but under their own source name and seed, as a
public benchmark would come from the same distribution as the training data.
"""

import sys
from pathlib import Path

# The repository's own package, also when run with a Python that has not installed it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stillroom.data.sources import generate
from stillroom.io import write_jsonl

# Operands up to 12: what the shipped file was generated with (a rerun reproduces it exactly).
MAX_OPERAND = 12

out = Path(__file__).resolve().parent.parent / "config" / "benchmarks" / "tinybench.jsonl"
items = generate("arithmetic", "tinybench", 40, seed=2024, max_operand=MAX_OPERAND) + generate(
    "choice", "tinybench", 24, seed=2024, max_operand=MAX_OPERAND
)
write_jsonl(
    out, [{k: r[k] for k in ("prompt_id", "prompt", "answer", "kind", "meta")} for r in items]
)
print(f"wrote {len(items)} items to {out}")
