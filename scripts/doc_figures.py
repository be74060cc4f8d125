"""Write the figures the documentation quotes from the estimate and the job shapes, never by hand.

    python scripts/doc_figures.py           # rewrite every figures block
    python scripts/doc_figures.py --check   # exit 1 if a block differs from what the code gives

Each block sits between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->`` in its page and is
one sentence made here from the shipped configs, offline and in seconds: the bill of beam-distill
(``stillroom estimate``), the flagship overlay's memory per GPU, the student's host memory per
node, the default student's size. tests/test_docs.py holds every block to this script's output.
(Measured figures, the review bundle's sizes, come from scripts/readme_bundle_figures.py.)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "config" / "experiments"


def _config(*files: str, **train: Any) -> dict[str, Any]:
    """The resolved config of ``files`` merged in order, with ``train`` keys over them."""
    from stillroom.config import load_yaml, merge_configs
    from stillroom.plan.checks import resolve

    merged: dict[str, Any] = {}
    for name in files:
        merged = merge_configs(merged, load_yaml(EXPERIMENTS / name))
    return resolve(merge_configs(merged, {"train": train}), REPO)


def beam_distill_bill() -> str:
    from stillroom.plan.estimate import bill

    b = bill(_config("beam-distill.yaml"), REPO)
    gen = b.parts["generation"]
    start_s = b.inputs["figures"]["teacher_start_s"]
    share = gen["start_gpu_hours"] / gen["gpu_hours"]
    per_mtok = gen["usd"] / gen["output_tokens"] * 1e6
    both = gen["usd"] + b.parts["training"]["usd"]
    return (
        f"`beam-distill` comes to ${gen['usd']:,.0f} for generation, ${per_mtok:.2f} per million "
        f"output tokens, {share:.1%} of its GPU-hours the {start_s:g} s start-up assumed once per "
        f"server ({gen['starts']} servers), and ${both:,.0f} for generation and training"
    )


STAGED = ("beam-distill.yaml", "beam-qlora-fsdp-staged.yaml")


def _memory(**train: Any) -> tuple[float, float, dict[str, float]]:
    """The flagship's training memory per GPU with ``train`` keys over it: need, room, terms (GB);
    a job that does not fit is refused, and its need read from the refusal."""
    from stillroom.plan.estimate import EstimateError, bill

    try:
        (m,) = bill(_config(*STAGED, **train), REPO).inputs["train_memory"].values()
    except EstimateError as exc:
        need, room = re.search(r"needs ([\d,.]+) GB per GPU .*? of ([\d,.]+) GB", str(exc)).groups()
        return float(need.replace(",", "")), float(room.replace(",", "")), {}
    return m["need_gb"], m["room_gb"], m["terms_gb"]


def flagship_memory() -> str:
    need16, room, _ = _memory()
    need32, _, _ = _memory(max_length=32768)
    need4, _, _ = _memory(distributed={"nodes": 1, "gpus_per_node": 4, "fsdp_size": 4})
    return (
        f"the flagship needs {need16:.0f} GB per H200 of {room:.0f} at 16k tokens and "
        f"{need32:.0f} GB at 32k; on 4 GPUs ({need4:.0f} GB at 16k) it is refused"
    )


def fused_loss() -> str:
    config = _config(*STAGED)
    tokens = config["train"]["max_length"]
    vocab = config["cost"]["estimate"]["models"]["reflection/beam"]["architecture"]["vocab_size"]
    _, _, terms = _memory()
    (loss,) = [gb for term, gb in terms.items() if term.startswith("the loss")]
    # whole logits: bf16, their float32 log-softmax and its gradient, 14 B an entry
    logits = vocab * 14 * tokens / 1e9
    return (
        f"Beam at {tokens // 1024}k tokens: {loss:.1f} GB, where whole logits would be "
        f"{logits:.0f} GB"
    )


def student_memory() -> str:
    from stillroom.plan.cluster import (
        STUDENT_FULL_MEM_MB,
        STUDENT_FULL_PARAMS,
        STUDENT_MIN_MEM_MB,
    )

    def size(mb: int) -> str:
        return f"{mb / 1e6:g} TB" if mb >= 1e6 else f"{mb / 1e3:g} GB"

    full = [STUDENT_FULL_MEM_MB[r] for r in ("train", "merge", "evaluate")]
    return (
        f"{', '.join(size(mb) for mb in full[:-1])} and {size(full[-1])} per node at a "
        f"{STUDENT_FULL_PARAMS / 1e9:g}B student, its share below, at least "
        f"{size(STUDENT_MIN_MEM_MB)}"
    )


def default_student() -> str:
    from stillroom.config import Experiment, load_yaml
    from stillroom.plan.estimate import student_parameters

    exp = Experiment.parse(load_yaml(REPO / "config" / "config.yaml"))
    return f"{student_parameters(exp, REPO) / 1e6:.1f}M-parameter"


# block name -> (page, what writes it)
BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "beam-distill-bill": ("docs/estimate.md", beam_distill_bill),
    "fused-loss": ("docs/estimate.md", fused_loss),
    "flagship-memory": ("docs/moe.md", flagship_memory),
    "student-memory": ("docs/slurm.md", student_memory),
    "default-student": ("docs/recipes.md", default_student),
}


def block(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- figures:{name} -->)(.*?)(<!-- /figures:{name} -->)", re.S)


def rendered() -> dict[str, str]:
    """Every page that holds a block, with each block written from the code."""
    pages: dict[str, str] = {}
    for name, (page, figure) in BLOCKS.items():
        text = pages.get(page) or (REPO / page).read_text()
        found = block(name).search(text)
        if found is None:
            raise SystemExit(f"{page}: no <!-- figures:{name} --> ... block")
        pages[page] = text[: found.end(1)] + figure() + text[found.start(3) :]
    return pages


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare, do not rewrite")
    args = ap.parse_args(argv)
    stale = []
    for page, text in rendered().items():
        if (REPO / page).read_text() != text:
            stale.append(page)
            if not args.check:
                (REPO / page).write_text(text)
    if args.check:
        print(
            f"stale: {', '.join(stale)}: run python scripts/doc_figures.py" if stale else "current"
        )
        return 1 if stale else 0
    print(f"wrote {', '.join(stale)}" if stale else "every block was current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
