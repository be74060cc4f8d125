"""The small model and data every check runs on (built once per run), and each check's
arguments at the run's sizes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..io import write_jsonl
from .common import Sizes


def sft_rows(count: int, max_turns: int, seed: int) -> list[dict]:
    """Conversations of 1..max_turns arithmetic problems, each answered with worked reasoning of
    varying detail: document lengths spread over ~an order of magnitude."""
    import random

    from ..data.sources import generate, worked_solution

    rng = random.Random(seed)
    problems = iter(generate("arithmetic", "gpu-check", count * max_turns, seed, max_operand=999))
    rows = []
    for i in range(count):
        messages = []
        for _ in range(rng.randint(1, max_turns)):
            rec = next(problems)
            reasoning, final = worked_solution(rec["meta"], rec["answer"], detail=rng.randrange(4))
            messages += [
                {"role": "user", "content": rec["prompt"]},
                {"role": "assistant", "content": f"<think>{reasoning}</think>\n{final}"},
            ]
        rows.append({"id": f"gpu-check-{i}", "messages": messages})
    return rows


def build_fixture(workdir: Path, sizes: Sizes, seed: int = 0, moe: bool = True) -> dict[str, Any]:
    """The SFT set, a BPE tokenizer trained on it, a random Qwen3 of ``sizes.model`` and, with
    ``moe``, a random Qwen3-MoE of ``sizes.moe_model``, as the tests build theirs (no model
    hub)."""
    from ..runtime.student import build_model, train_tokenizer

    rows = sft_rows(sizes.conversations, sizes.max_turns, seed)
    write_jsonl(workdir / "sft.jsonl", rows)
    train_tokenizer(
        [m["content"] for r in rows for m in r["messages"]],
        workdir / "tokenizer",
        vocab_size=sizes.vocab_size,
        min_frequency=2,
    )
    built = build_model(workdir / "tokenizer", workdir / "base", model=sizes.model, seed=seed)
    out = {
        "dataset": str(workdir / "sft.jsonl"),
        "base": str(workdir / "base"),
        "conversations": len(rows),
        **built,
    }
    if moe:
        # float32 on disk, as build_model saves it: the merge is then compared in float32
        moe_built = build_model(
            workdir / "tokenizer", workdir / "moe", model=sizes.moe_model, seed=seed
        )
        out.update(moe_base=str(workdir / "moe"), moe_parameters=moe_built["parameters"])
    return out


def check_kwargs(name: str, device: str, s: Sizes, fixture: Mapping[str, Any]) -> dict:
    """The arguments of check ``name`` on ``device`` at sizes ``s``, on the model and data of
    ``fixture`` (build_fixture)."""
    if name == "sft":
        return dict(
            base_dir=fixture["base"],
            dataset=fixture["dataset"],
            device=device,
            steps=s.steps,
            docs_per_step=s.docs_per_step,
            max_length=s.max_length,
            trainer_rows=s.trainer_rows,
            lr=s.lr,
        )
    if name == "qlora":
        return dict(
            base_dir=fixture["base"],
            dataset=fixture["dataset"],
            device=device,
            steps=s.steps,
            trainer_rows=s.trainer_rows,
            max_length=s.max_length,
            lr=s.qlora_lr,
            lora_r=s.lora_r,
        )
    if name == "qlora_fsdp_staged":
        return dict(
            base_dir=fixture["moe_base"],
            dataset=fixture["dataset"],
            device=device,
            steps=s.moe_steps,
            trainer_rows=s.trainer_rows,
            max_length=s.max_length,
            lr=s.qlora_lr,
            lora_r=s.lora_r,
        )
    if name == "evaluate":
        return dict(
            base_dir=fixture["base"],
            device=device,
            problems=s.eval_problems,
            samples=s.eval_samples,
            max_new_tokens=s.eval_new_tokens,
        )
    return dict(
        problems=list(s.kernel_problems) if s.kernel_problems else None,
        device=device,
        trials=s.kernel_trials,
        timeout_s=s.kernel_timeout_s,
        workers=s.kernel_workers,
        budget_s=None,  # from the limit the check gets (run_checks)
    )
