"""The record every prompt travels as, from the pool to the generation shards."""

from __future__ import annotations

from typing import Any

from ..ids import normalize_prompt, prompt_id

POOL_KEYS = ("prompt_id", "source", "kind", "prompt", "answer")


def record(
    source: str, kind: str, prompt: str, answer: str, meta: dict[str, Any]
) -> dict[str, Any]:
    """A pool record; its id comes from the normalised prompt. A kernel or coding problem's prompt
    is code, kept verbatim: folded whitespace would break it."""
    prompt = prompt if kind in ("kernel", "code") else normalize_prompt(prompt)
    return {
        "prompt_id": prompt_id(prompt, source),
        "source": source,
        "kind": kind,
        "prompt": prompt,
        "answer": answer,
        "meta": meta,
    }
