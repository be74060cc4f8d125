"""Regenerate config/benchmarks/tinybench.jsonl, the small shipped benchmark of the embedded default.

Its items come from the same generator as the pool but under their own source name and seed, as a
public benchmark would come from the same distribution as the training data.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stillroom.io import write_jsonl  # noqa: E402
from stillroom.sources import generate  # noqa: E402

out = Path(__file__).resolve().parent.parent / "config" / "benchmarks" / "tinybench.jsonl"
items = generate("arithmetic", "tinybench", 40, seed=2024) + generate(
    "choice", "tinybench", 24, seed=2024
)
write_jsonl(
    out, [{k: r[k] for k in ("prompt_id", "prompt", "answer", "kind", "meta")} for r in items]
)
print(f"wrote {len(items)} items to {out}")
