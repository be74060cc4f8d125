"""Long answers under honest limits.

``continue_truncated``: an answer cut off at the per-request limit is continued from its exact
tokens (raw completion on prompt + answer so far) until it finishes or reaches the overall limit;
the record keeps every segment. A hard 32k cutoff made a base model look far worse than it was.

``budget_force``: at a thinking budget B, an answer still thinking is closed (end-of-thinking marker
and an answer cue appended) and the model answers within a small cap; one that closed its thinking
within B is left as it is (and may finish its answer). Cut-offs are then never scored as wrong
answers: every answer gets its chance to answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..grading.formats import END_THINK


@dataclass
class Answer:
    token_ids: list[int]
    segments: list[str]  # the text of each request, in order
    finish_reason: str  # "stop", or "length" when still cut off at the overall limit
    forced: bool = False  # budget forcing closed the thinking
    thinking_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


def continue_truncated(
    lm,
    prefixes: Sequence[Sequence[int]],
    first: Sequence,
    *,
    limit: int,
    request_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
) -> list[Answer]:
    """Answers for ``prefixes`` (rendered prompts as token ids) from their first segments ``first``
    (one ``Sample`` each), continued in batches of the still cut-off ones while under ``limit``
    tokens."""
    answers = [Answer(list(s.token_ids), [s.text], s.finish_reason) for s in first]
    for round_ in range(1, limit // max(1, request_tokens) + 2):
        todo = [
            i
            for i, a in enumerate(answers)
            if a.finish_reason == "length" and a.completion_tokens < limit
        ]
        if not todo:
            break
        outs = lm.complete(
            [list(prefixes[i]) + answers[i].token_ids for i in todo],
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=request_tokens,
            seed=seed + 7919 * round_,
        )
        for i, out in zip(todo, outs, strict=True):
            a = answers[i]
            room = limit - a.completion_tokens
            new = out.token_ids[:room]
            a.token_ids += new
            a.segments.append(out.text if len(new) == len(out.token_ids) else lm.decode(new))
            a.finish_reason = out.finish_reason if len(new) == len(out.token_ids) else "length"
    return answers


def budget_force(
    lm,
    prefixes: Sequence[Sequence[int]],
    *,
    budget: int,
    answer_tokens: int,
    cue: str,
    temperature: float,
    top_p: float,
    seed: int,
) -> list[Answer]:
    """One answer per prefix with thinking capped at ``budget`` tokens, then up to
    ``answer_tokens`` more."""
    first = lm.complete(
        prefixes, temperature=temperature, top_p=top_p, max_new_tokens=budget, seed=seed
    )
    answers, todo, forced_ids = [], [], lm.encode(END_THINK + cue)
    for i, s in enumerate(first):
        a = Answer(list(s.token_ids), [s.text], s.finish_reason)
        if END_THINK in s.text:
            a.thinking_tokens = _thinking_tokens(lm, s.token_ids)
        elif s.finish_reason == "length":
            # still thinking at B: close it here, exactly at B tokens
            a.forced, a.thinking_tokens = True, len(s.token_ids)
            a.token_ids += forced_ids
            a.segments.append(END_THINK + cue)
        # forced, or thought within B but was cut off answering
        if a.finish_reason == "length":
            todo.append(i)
        answers.append(a)
    if todo:
        outs = lm.complete(
            [list(prefixes[i]) + answers[i].token_ids for i in todo],
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=answer_tokens,
            seed=seed + 1,
        )
        for i, out in zip(todo, outs, strict=True):
            answers[i].token_ids += out.token_ids
            answers[i].segments.append(out.text)
            answers[i].finish_reason = out.finish_reason
    return answers


def _thinking_tokens(lm, ids: list[int]) -> int:
    """Tokens up to and including the end-of-thinking marker: the shortest prefix whose text
    contains it (monotone in the prefix length, so a binary search: O(log n) decodes of 64k-token
    answers)."""
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        if END_THINK in lm.decode(ids[:mid]):
            high = mid
        else:
            low = mid + 1
    return low
